//! Which cgroup hierarchies the exec records name a process's cgroup in: the v1 hierarchy of
//! one controller, and the unified (v2) one, each where it is mounted.
//!
//! `bpf_get_current_cgroup_id()` names only the unified cgroup, and on a hybrid machine (v1
//! controllers, and the unified hierarchy beside them) container engines with the cgroupfs
//! driver put containers in the v1 hierarchies only (`/sys/fs/cgroup/memory/docker/<id>`). So
//! the kernel reads paths, from the v1 hierarchy of a controller that is really mounted as v1:
//! a controller bound to the unified hierarchy would give the nearest ancestor where it is
//! enabled, not the process's own cgroup.

use std::{fmt, io, path::PathBuf};

use procfs::{process::MountInfos, FromBufRead};

use super::btf::{Btf, BtfError};

/// v1 controllers in the order they are preferred: every container engine and kubelet, with
/// either driver, makes each container a cgroup of `memory` (for its limit) and of `pids`; the
/// rest follow the kernel's order.
const PREFERRED: &[&str] = &[
    "memory",
    "pids",
    "cpu",
    "cpuacct",
    "cpuset",
    "blkio",
    "devices",
    "freezer",
    "net_cls",
    "perf_event",
    "net_prio",
    "hugetlb",
    "rdma",
    "misc",
];

/// A controller's v1 hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V1 {
    /// As in `/proc/cgroups` and `/proc/<pid>/cgroup` (`memory`).
    pub controller: String,
    pub mount_point: PathBuf,
}

/// The hierarchies read, per the mounts of the agent's mount namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hierarchies {
    pub v1: Option<V1>,
    /// Where the unified hierarchy is mounted.
    pub v2: Option<PathBuf>,
}

impl Hierarchies {
    /// From `/proc/self/mountinfo`.
    pub fn of_this_namespace() -> io::Result<Hierarchies> {
        let file = std::fs::File::open("/proc/self/mountinfo")?;
        Hierarchies::from_mountinfo(io::BufReader::new(file))
    }

    /// From the text of a `mountinfo` file. A hierarchy mounted more than once (bind mounts of
    /// a cgroup in containers) is named by its mount of the hierarchy's root, if any.
    pub fn from_mountinfo(text: impl io::BufRead) -> io::Result<Hierarchies> {
        let mounts = MountInfos::from_buf_read(text).map_err(io::Error::other)?;
        let best = |found: Option<PathBuf>, root: &str, point: &PathBuf| match found {
            Some(found) if root != "/" => Some(found),
            _ => Some(point.clone()),
        };
        let mut v2 = None;
        let mut v1: Vec<(&str, PathBuf)> = Vec::new();
        for mount in &mounts {
            match mount.fs_type.as_str() {
                "cgroup2" => v2 = best(v2, &mount.root, &mount.mount_point),
                "cgroup" => {
                    for &controller in PREFERRED.iter().filter(|c| mount.super_options.contains_key(**c)) {
                        match v1.iter_mut().find(|(name, _)| *name == controller) {
                            Some((_, point)) if mount.root == "/" => point.clone_from(&mount.mount_point),
                            Some(_) => {}
                            None => v1.push((controller, mount.mount_point.clone())),
                        }
                    }
                }
                _ => {}
            }
        }
        let v1 = PREFERRED.iter().find_map(|&preferred| {
            let (controller, mount_point) = v1.iter().find(|(name, _)| *name == preferred)?;
            Some(V1 { controller: (*controller).to_owned(), mount_point: mount_point.clone() })
        });
        Ok(Hierarchies { v1, v2 })
    }

    /// The index of the v1 controller in the kernel's `enum cgroup_subsys_id`
    /// ([`credwatch_common::NO_CGROUP_SUBSYS`] without one).
    pub fn subsys_index(&self, btf: &Btf) -> Result<u32, BtfError> {
        let Some(v1) = &self.v1 else { return Ok(credwatch_common::NO_CGROUP_SUBSYS) };
        // The block I/O controller is `io` in the kernel, `blkio` (its legacy name) in v1.
        let name = if v1.controller == "blkio" { "io" } else { v1.controller.as_str() };
        let index = btf.enum_value("cgroup_subsys_id", &format!("{name}_cgrp_id"))?;
        u32::try_from(index).map_err(|_| BtfError::Malformed("cgroup_subsys_id value out of range"))
    }
}

impl fmt::Display for Hierarchies {
    /// One line: `v1 memory (/sys/fs/cgroup/memory), v2 (/sys/fs/cgroup/unified)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(v1) = &self.v1 {
            parts.push(format!("v1 {} ({})", v1.controller, v1.mount_point.display()));
        }
        if let Some(v2) = &self.v2 {
            parts.push(format!("v2 ({})", v2.display()));
        }
        if parts.is_empty() {
            return f.write_str("none (no cgroup hierarchy is mounted)");
        }
        f.write_str(&parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";

    fn parse(text: &str) -> Hierarchies {
        Hierarchies::from_mountinfo(text.as_bytes()).unwrap()
    }

    #[test]
    fn picks_a_v1_controller_and_the_unified_mount() {
        let hybrid = parse(HYBRID);
        assert_eq!(
            hybrid,
            Hierarchies {
                v1: Some(V1 { controller: "memory".into(), mount_point: "/sys/fs/cgroup/memory".into() }),
                v2: Some("/sys/fs/cgroup/unified".into()),
            }
        );
        assert_eq!(hybrid.to_string(), "v1 memory (/sys/fs/cgroup/memory), v2 (/sys/fs/cgroup/unified)");
        // Without memory, pids; a hierarchy of two controllers is found by either.
        let no_memory = parse(&HYBRID.replace("rw,memory", "rw,hugetlb").replace("rw,pids", "rw,freezer"));
        assert_eq!(no_memory.v1.unwrap().mount_point, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        // A named hierarchy (systemd's) is no controller's.
        let named_only = "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";
        assert_eq!(parse(named_only), Hierarchies::default());
        assert_eq!(Hierarchies::default().to_string(), "none (no cgroup hierarchy is mounted)");
    }

    #[test]
    fn pure_v2_and_bind_mounted_hierarchies() {
        let pure = parse("29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
        assert_eq!(pure, Hierarchies { v1: None, v2: Some("/sys/fs/cgroup".into()) });
        assert_eq!(pure.to_string(), "v2 (/sys/fs/cgroup)");
        // A container's view of its own cgroup first, then the hierarchy's root.
        let bound = parse(
            "50 40 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n\
             51 40 0:32 / /host/cgroup/memory ro - cgroup cgroup rw,memory\n\
             52 40 0:38 /docker/abc /sys/fs/cgroup/unified ro - cgroup2 cgroup2 rw\n",
        );
        assert_eq!(bound.v1.unwrap().mount_point, PathBuf::from("/host/cgroup/memory"));
        assert_eq!(bound.v2, Some("/sys/fs/cgroup/unified".into()));
        assert!(Hierarchies::from_mountinfo("not a mountinfo line\n".as_bytes()).is_err());
    }

    /// `/proc/cgroups` lists the controllers in the order of `enum cgroup_subsys_id`, so each
    /// one's line number is the index the BTF gives.
    #[test]
    fn controller_indexes_agree_with_proc_cgroups() {
        let btf = Btf::from_sys_fs().expect("the test machine has /sys/kernel/btf/vmlinux");
        let listed = std::fs::read_to_string("/proc/cgroups").unwrap();
        let names: Vec<&str> =
            listed.lines().filter(|line| !line.starts_with('#')).filter_map(|l| l.split('\t').next()).collect();
        assert!(names.contains(&"memory"), "{listed}");
        for (index, name) in names.iter().enumerate() {
            let hierarchies =
                Hierarchies { v1: Some(V1 { controller: (*name).to_owned(), mount_point: PathBuf::new() }), v2: None };
            assert_eq!(hierarchies.subsys_index(&btf).unwrap(), index as u32, "{name}");
        }
        assert_eq!(Hierarchies::default().subsys_index(&btf).unwrap(), credwatch_common::NO_CGROUP_SUBSYS);
        let unknown = Hierarchies { v1: Some(V1 { controller: "nope".into(), mount_point: PathBuf::new() }), v2: None };
        assert!(matches!(unknown.subsys_index(&btf), Err(BtfError::NoEnumerator { .. })));
    }
}
