//! The model's thread at a lower scheduling priority (`cache_model.nice`): on a machine the
//! benchmark saturates, tokenizing every body took a whole core from the data workers. Niced,
//! the thread gets only the CPU forwarding leaves; when that is too little its queue fills and
//! requests are counted as unaccounted (`queue_full`), never slowed.

/// Lowers the calling thread's priority to `nice` (Linux keeps a nice value per thread, so the
/// process's other threads keep theirs). Does nothing for 0, or when the thread already runs at
/// that nice or higher: going back up would need privilege, and would put the model ahead of
/// forwarding. A failure is one warning; the model then runs as the process does.
#[cfg(target_os = "linux")]
pub(super) fn lower_this_thread(nice: i32) {
    use rustix::process::{getpriority_process, setpriority_process};
    if nice == 0 {
        return;
    }
    // PRIO_PROCESS with a thread id addresses that one thread on Linux.
    let tid = Some(rustix::thread::gettid());
    if getpriority_process(tid).is_ok_and(|current| current >= nice) {
        return;
    }
    if let Err(e) = setpriority_process(tid, nice) {
        tracing::warn!(
            "cache_model.nice: cannot set the cache model's thread to nice {nice} ({e}); it runs \
             at the process's priority"
        );
    }
}

/// Other systems: the thread runs as the process does.
#[cfg(not(target_os = "linux"))]
pub(super) fn lower_this_thread(_nice: i32) {}
