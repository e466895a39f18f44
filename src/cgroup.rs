//! The memory limit of the cgroup kvbust runs in (a container's `resources.limits.memory`), read
//! once at start so `limits.max_buffered_total` cannot promise more memory than the container
//! may use. Pure file reads; the caller decides what to do with the number.

use std::path::Path;

/// Where the cgroup filesystem is mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// cgroup v1 reports "no limit" as a huge page-rounded number (about 2^63); anything above
/// this is no limit.
const V1_UNLIMITED: u64 = 1 << 60;

/// The memory limit in bytes under `root`: cgroup v2's `memory.max`, else cgroup v1's
/// `memory/memory.limit_in_bytes`. `None` when there is no limit or no cgroup file to read.
pub fn memory_limit(root: &Path) -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string(root.join("memory.max")) {
        // "max" is no limit.
        return text.trim().parse::<u64>().ok();
    }
    let text = std::fs::read_to_string(root.join("memory/memory.limit_in_bytes")).ok()?;
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&n| n < V1_UNLIMITED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_root(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let root = crate::test_support::test_dir().join(name);
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        std::fs::create_dir_all(&root).unwrap();
        root
    }

    #[test]
    fn reads_cgroup_v2_and_v1_limits_and_no_limit() {
        let v2 = fake_root("v2", &[("memory.max", "536870912\n")]);
        assert_eq!(memory_limit(&v2), Some(512 << 20));
        let v2_max = fake_root("v2max", &[("memory.max", "max\n")]);
        assert_eq!(memory_limit(&v2_max), None);
        let v1 = fake_root("v1", &[("memory/memory.limit_in_bytes", "268435456\n")]);
        assert_eq!(memory_limit(&v1), Some(256 << 20));
        let v1_none = fake_root(
            "v1none",
            &[("memory/memory.limit_in_bytes", "9223372036854771712\n")],
        );
        assert_eq!(memory_limit(&v1_none), None);
        let empty = fake_root("none", &[]);
        assert_eq!(memory_limit(&empty), None);
        for r in [v2, v2_max, v1, v1_none, empty] {
            std::fs::remove_dir_all(r).unwrap();
        }
    }
}
