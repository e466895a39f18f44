//! The word lists the coding-corpus generators draw from: identifiers, packages, paths, hosts,
//! people, error texts and model names, as data in `assets/coding-exact/*.txt` (embedded with
//! `include_str!`, parsed once). Owns the lists and their file format; must never hold state
//! beyond the parsed lists or draw.
//!
//! Format: UTF-8, one item per line, every line ends with `\n` and is the item verbatim (no
//! trimming, no comments, no escapes), so an item can hold any character but a line break; the
//! GPU list is `name<TAB>memory in GB` per line. [`tests`] checks every file round-trips.

use std::sync::LazyLock;

/// A word list parsed from its embedded file on first use.
pub type Words = LazyLock<Vec<&'static str>>;

/// The items of a list file: its lines, without their `\n`.
fn lines(text: &'static str) -> Vec<&'static str> {
    text.split_terminator('\n').collect()
}

/// `name<TAB>memory in GB` lines.
fn gpus(text: &'static str) -> Vec<(&'static str, u64)> {
    lines(text)
        .into_iter()
        .map(|l| {
            let (name, gb) = l.split_once('\t').unwrap_or((l, ""));
            // The file is embedded and checked by the tests below, so a bad line is a build bug.
            let gb = gb
                .parse()
                .unwrap_or_else(|_| panic!("assets/coding-exact/gpus.txt: bad line {l:?}"));
            (name, gb)
        })
        .collect()
}

/// Declares one list per `NAME => "file.txt"`, and [`FILES`] with every file's name and text.
macro_rules! word_lists {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[doc = concat!("`assets/coding-exact/", $file, "`.")]
            pub static $name: Words = LazyLock::new(|| {
                lines(include_str!(concat!("../../../../assets/coding-exact/", $file)))
            });
        )*
        /// Every one-item-per-line list file: (name, embedded text).
        #[cfg(test)]
        const FILES: &[(&str, &str)] = &[
            $(($file, include_str!(concat!("../../../../assets/coding-exact/", $file))),)*
        ];
    };
}

word_lists! {
    NOUNS => "nouns.txt",
    VERBS => "verbs.txt",
    VERBS_3RD => "verbs-3rd.txt",
    ADJS => "adjs.txt",
    STATES => "states.txt",
    TYPE_SUFFIXES => "type-suffixes.txt",
    TOP_DIRS => "top-dirs.txt",
    SUB_DIRS => "sub-dirs.txt",
    FILE_STEMS => "file-stems.txt",
    PROJECT_SUFFIXES => "project-suffixes.txt",
    PROJECT_NAMES => "project-names.txt",
    HOST_WORDS => "host-words.txt",
    FIRST_NAMES => "first-names.txt",
    LAST_NAMES => "last-names.txt",
    PY_PACKAGES => "py-packages.txt",
    PY_STDLIB => "py-stdlib.txt",
    GO_IMPORTS => "go-imports.txt",
    RUST_CRATES => "rust-crates.txt",
    TS_PACKAGES => "ts-packages.txt",
    PY_EXCEPTIONS => "py-exceptions.txt",
    HTTP_PATHS => "http-paths.txt",
    HTTP_METHODS => "http-methods.txt",
    MODELS => "models.txt",
    TOPICS => "topics.txt",
    ERROR_PHRASES => "error-phrases.txt",
    TOOLS => "tools.txt",
}

const GPUS_TXT: &str = include_str!("../../../../assets/coding-exact/gpus.txt");

/// GPU model names with their memory in GB (`assets/coding-exact/gpus.txt`).
pub static GPUS: LazyLock<Vec<(&'static str, u64)>> = LazyLock::new(|| gpus(GPUS_TXT));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_round_trips() {
        for (name, text) in FILES.iter().chain([("gpus.txt", GPUS_TXT)].iter()) {
            let items = lines(text);
            assert!(!items.is_empty(), "{name} is empty");
            // Joining the items back gives the file byte for byte: nothing was trimmed or lost.
            assert_eq!(items.join("\n") + "\n", *text, "{name}");
            for item in &items {
                assert!(!item.is_empty(), "{name}: empty line");
                assert!(
                    !item.contains('\r'),
                    "{name}: {item:?} has a carriage return"
                );
                assert_eq!(item.trim(), *item, "{name}: {item:?} has outer whitespace");
            }
        }
    }

    #[test]
    fn lists_parse() {
        assert_eq!(lines("a\nb c\n"), ["a", "b c"]);
        assert_eq!(NOUNS.first(), Some(&"user"));
        assert_eq!(GPUS.len(), GPUS_TXT.lines().count());
        assert_eq!(GPUS[0], ("NVIDIA A100-SXM4-80GB", 80));
    }
}
