//! Cache-bust engine: targets, markers, session identity and the pure body rewrite. Never does I/O.
