//! Loading: opening the eBPF object (or adopting a pinned set), resolving the kernel's
//! offsets from BTF, sizing and filling the maps, and attaching the programs.

use std::{io, path::Path, time::Instant};

use aya::{
    maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray},
    programs::{links::FdLink, BtfTracePoint, Program, RawTracePoint, TracePoint},
    util::KernelVersion,
    Btf as AyaBtf, Ebpf, EbpfLoader,
};
use credwatch_common::{
    config_flag, manager_flag, Config, CredInode, InodeKey, KernelOffsets, LostTree, ManagerValue, Mark, SparedExe,
    MANAGER_NAME_LEN, MODULE_KEY_LEN, NO_CGROUP_SUBSYS,
};
use credwatch_core::rules::manager::Manager;

use super::{
    backend::{self, Backend, SensorOptions},
    blind::TreeLosses,
    boot_ns, btf,
    canary::CANARY_INTERVAL,
    cgroups,
    hooks::{
        fentry_hooks, fentry_work, fill_syscalls, hook_programs, raw_tracepoints, syscall_hooks, uring_opcode_offset,
        uring_tracepoint, SyscallHook, COSTLIEST_TO_VERIFY, FORK_BTF, FORK_TRACEPOINT, URING_PROGRAM,
    },
    kernel_log, kernel_object, map_err, offsets,
    pins::{self, Gap, Pins, Started},
    program_err,
    task_marks::{Globals, TaskMarks},
    Sensor, SensorError, SensorStats, TRACEFS,
};
use credwatch_core::record::Decoder;

/// The initial PID namespace's inode number (`PROC_PID_INIT_INO`, include/linux/proc_ns.h).
pub(super) const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// Says so when the agent runs in a PID namespace of its own (a container without the host's):
/// the kernel programs know processes by the host's pids and the agent hands them its own
/// namespace's, so they protect another process than the agent, and its canary (marked by its
/// pid here) never reports back.
pub(super) fn warn_in_a_pid_namespace() {
    let Ok(namespace) = std::fs::metadata("/proc/self/ns/pid") else { return };
    if std::os::unix::fs::MetadataExt::ino(&namespace) != INITIAL_PID_NAMESPACE {
        tracing::warn!(
            "credwatch runs in a PID namespace of its own, and the kernel programs know processes by the host's \
             pids: its protection of itself (signal-to-agent, --enforce) guards another pid and its self-check \
             reports the programs detached; run it in the host's PID namespace (docker --pid=host, Kubernetes \
             hostPID: true, systemd-nspawn cannot)"
        );
    }
}

/// Loads the `wanted` programs. The kernel verifies each on the loading thread, and that is
/// most of start-up, so one thread per core takes the next program from a queue: `wanted`
/// lists the costliest to verify first (the path walks), and the cheap ones fill in behind.
pub(super) fn load_programs(ebpf: &mut Ebpf, wanted: &[&'static str]) -> Result<(), SensorError> {
    let mut by_name: std::collections::HashMap<&str, &mut Program> = ebpf.programs_mut().collect();
    let mut queue = Vec::with_capacity(wanted.len());
    for &name in wanted {
        let program = by_name.remove(name).ok_or(SensorError::Missing { what: "program", name })?;
        // Loaded already, beside the fentry backend's programs.
        if program.fd().is_err() {
            queue.push((name, program));
        }
    }
    let queue = std::sync::Mutex::new(queue.into_iter());
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    std::thread::scope(|scope| {
        let loaders: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| loop {
                    let Some((name, program)) = queue.lock().unwrap_or_else(|e| e.into_inner()).next() else {
                        return Ok(());
                    };
                    match program {
                        Program::TracePoint(program) => program.load(),
                        Program::RawTracePoint(program) => program.load(),
                        _ => return Err(SensorError::NotTracepoint { name }),
                    }
                    .map_err(program_err(name))?;
                })
            })
            .collect();
        loaders.into_iter().try_for_each(|loader| loader.join().unwrap_or(Err(SensorError::LoaderPanicked)))
    })
}

/// Mounts tracefs when it is not there (some machines boot without it).
pub(super) fn ensure_tracefs() -> Result<(), SensorError> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    // SAFETY: NUL-terminated literals; no data argument.
    let rc = unsafe {
        libc::mount(c"tracefs".as_ptr(), c"/sys/kernel/tracing".as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null())
    };
    if rc != 0 {
        return Err(SensorError::Tracefs(io::Error::last_os_error()));
    }
    Ok(())
}

/// Maps and program memory are charged to RLIMIT_MEMLOCK on kernels before 5.11 (memcg since).
/// Unlimited when allowed, else as far as the hard limit goes (containers often cap it).
pub(super) fn raise_memlock() -> Result<(), SensorError> {
    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: valid rlimit pointers for the duration of each call.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) == 0 {
            return Ok(());
        }
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) != 0 {
            return Err(SensorError::Memlock(io::Error::last_os_error()));
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) != 0 {
            return Err(SensorError::Memlock(io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// NUL-padded fixed-size key; `None` when `words` do not fit.
pub(super) fn padded_key<const N: usize>(bytes: &[u8]) -> Option<[u8; N]> {
    let mut key = [0u8; N];
    key.get_mut(..bytes.len())?.copy_from_slice(bytes);
    Some(key)
}

/// The kernel's tables of managers (the eBPF program's `MANAGERS`, `MANAGER_MODULES` and
/// `MANAGER_SCRIPTS` maps).
#[derive(Debug, Default)]
pub struct ManagerKeys {
    /// Exec basenames, and interpreters that need a module or a script to be a root.
    pub names: Vec<([u8; MANAGER_NAME_LEN], ManagerValue)>,
    /// Module words (`-m\0pip\0`) -> manager index.
    pub modules: Vec<([u8; MODULE_KEY_LEN], u32)>,
    /// Script stems (`yarn` of `yarn-*.cjs`) -> manager index.
    pub scripts: Vec<([u8; MANAGER_NAME_LEN], u32)>,
}

/// The kernel keys for `managers`: exec basenames, module words (`-m\0pip\0`) and script stems.
pub fn manager_keys(managers: &[Manager]) -> Result<ManagerKeys, SensorError> {
    let mut keys = ManagerKeys::default();
    let too_long = |manager: &Manager, what, value: &str| SensorError::KeyTooLong {
        manager: manager.name.clone(),
        what,
        value: value.to_owned(),
        max: if what == "module args" { MODULE_KEY_LEN } else { MANAGER_NAME_LEN },
    };
    for (index, manager) in managers.iter().enumerate() {
        let index = index as u32;
        for exec in &manager.execs {
            let key = padded_key(exec.as_bytes()).ok_or_else(|| too_long(manager, "exec", exec))?;
            // A plain exec is a root whatever its argv, even if another manager's interpreter.
            keys.names.retain(|(name, _)| *name != key);
            keys.names.push((key, ManagerValue { manager: index, flags: 0 }));
        }
        let mut interpreters = Vec::new();
        for module in &manager.modules {
            let joined: Vec<u8> = module.args.iter().flat_map(|w| w.bytes().chain([0])).collect();
            let key = padded_key(&joined).ok_or_else(|| too_long(manager, "module args", &module.args.join(" ")))?;
            keys.modules.push((key, index));
            interpreters.extend(module.interpreters.iter().map(|name| (name, manager_flag::NEEDS_MODULE)));
        }
        for scripts in &manager.scripts {
            for pattern in &scripts.files {
                let stem = credwatch_core::rules::manager::pattern_stem(pattern).unwrap_or(pattern);
                let key = padded_key(stem.as_bytes()).ok_or_else(|| too_long(manager, "script stem", stem))?;
                if !keys.scripts.contains(&(key, index)) {
                    keys.scripts.push((key, index));
                }
            }
            interpreters.extend(scripts.interpreters.iter().map(|name| (name, manager_flag::NEEDS_SCRIPT)));
        }
        for (name, flag) in interpreters {
            let key = padded_key(name.as_bytes()).ok_or_else(|| too_long(manager, "interpreter", name))?;
            match keys.names.iter_mut().find(|(existing, _)| *existing == key) {
                // A plain exec of the same basename wins.
                Some((_, value)) if value.flags == 0 => {}
                Some((_, value)) => value.flags |= flag,
                None => keys.names.push((key, ManagerValue { manager: index, flags: flag })),
            }
        }
    }
    Ok(keys)
}

impl Sensor {
    /// Loads and attaches the kernel programs. With `auto_roots`, an exec of one of `managers`
    /// makes a package root (`watch`); without, only [`Sensor::mark_root`] and [`Sensor::seed`]
    /// do (`run`). They are detached when the sensor stops.
    pub fn start(managers: &[Manager], auto_roots: bool, options: SensorOptions) -> Result<Sensor, SensorError> {
        warn_in_a_pid_namespace();
        Sensor::load(managers, auto_roots, None, options)
    }

    /// Like [`Sensor::start`] with `auto_roots` (`watch`), with a kernel side that outlives
    /// the agent, pinned in `dir` (see [`pins`]): a set of this build pinned there is adopted
    /// (programs never detached, what waited in the ring buffers read next), any other set is
    /// replaced. [`Sensor::finish`] leaves the set pinned; [`pins::stop`] detaches it.
    pub fn start_pinned(
        managers: &[Manager],
        dir: &Path,
        options: SensorOptions,
    ) -> Result<(Sensor, Started), SensorError> {
        // Before the pinned set is looked at: a binary without programs replaces nothing.
        kernel_object()?;
        warn_in_a_pid_namespace();
        pins::ensure_bpffs()?;
        pins::remove_abandoned(dir)?;
        // The syscall tracepoints (the tracepoint backend) and io_uring's (both) attach through
        // a perf event where the kernel has no perf links (aya falls back to the perf ioctl).
        if !aya::features().bpf_perf_link() {
            if dir.exists() {
                pins::check_is_set(dir)?;
            }
            let sensor = Sensor::load(managers, true, None, options)?;
            return Ok((sensor, Started::Unpinned(pins::NO_TRACEPOINT_LINKS.to_owned())));
        }
        let mut replaced = None;
        if dir.exists() {
            pins::check_is_set(dir)?;
            match pins::read_state(dir) {
                Ok(state) => {
                    if let Some(pid) = pins::running_agent(&state) {
                        return Err(SensorError::AlreadyRunning { pid, dir: dir.display().to_string() });
                    }
                    let (pinned, _) = backend::pinned_backend(dir);
                    if state.object_id != pins::object_id() {
                        replaced = Some("it was loaded from another build of the eBPF programs".to_owned());
                    } else if options.backend != Backend::Auto && options.backend != pinned {
                        replaced =
                            Some(format!("it runs the {pinned} backend, not the {} one asked for", options.backend));
                    } else {
                        match Sensor::adopt(managers, dir, state) {
                            Ok(sensor) => {
                                if !options.map_sizes.is_empty() {
                                    tracing::warn!(
                                        "the kernel side pinned in {} keeps its map sizes: {} applies at the next \
                                         load (after `credwatch stop`)",
                                        dir.display(),
                                        options.map_sizes
                                    );
                                }
                                let started = sensor.gap.map_or(Started::Fresh, Started::Adopted);
                                return Ok((sensor, started));
                            }
                            Err(error) => replaced = Some(format!("adopting it failed: {error}")),
                        }
                    }
                }
                Err(why) => replaced = Some(why),
            }
        }
        // Built aside and moved into place whole; the set it replaces runs until then.
        let building = pins::building_dir(dir);
        pins::create_dir(&building)?;
        let result = Sensor::load(managers, true, Some(&building), options).and_then(|mut sensor| {
            if replaced.is_some() {
                pins::remove(dir)?;
            }
            pins::publish(&building, dir)?;
            if let Some(pins) = &mut sensor.pins {
                pins.dir = dir.to_path_buf();
            }
            Ok(sensor)
        });
        match result {
            Ok(sensor) => Ok((sensor, replaced.map_or(Started::Fresh, Started::Replaced))),
            Err(error) => {
                let _ = pins::remove(&building);
                Err(error)
            }
        }
    }

    /// Takes over the set pinned in `dir` by an agent of this build that is gone: the maps are
    /// opened, the agent's pid in `CONFIG` (spared from reports, protected by `--enforce`)
    /// becomes this one, and the managers come from the rules of now.
    fn adopt(managers: &[Manager], dir: &Path, previous: pins::AgentState) -> Result<Sensor, SensorError> {
        raise_memlock()?;
        let keys = manager_keys(managers)?;
        let until_boot_ns = boot_ns();
        let mut pins = Pins::open(dir)?;
        let mut config_map: Array<MapData, Config> = pins::open_map(dir, "CONFIG", Map::Array)?;
        let mut config = config_map.get(&0, 0).map_err(map_err("CONFIG"))?;
        config.agent_tgid = std::process::id();
        // `--enforce` stays as it was until [`Sensor::protect`] says.
        config.flags = config_flag::AUTO_ROOTS | (config.flags & config_flag::ENFORCE);
        config_map.set(0, config, 0).map_err(map_err("CONFIG"))?;
        // Seeded processes name the hierarchies the kernel reads, which the agent that loaded
        // the set chose (the v1 controller's index needs the BTF, which adopting skips).
        let mut hierarchies = cgroups::Hierarchies::of_this_namespace().map_err(SensorError::Proc)?;
        if config.cgroup_subsys == NO_CGROUP_SUBSYS {
            hierarchies.v1 = None;
        }
        if config.cgroup_v2 == 0 {
            hierarchies.v2 = None;
        }
        let mut manager_map: HashMap<MapData, [u8; MANAGER_NAME_LEN], ManagerValue> =
            pins::open_map(dir, "MANAGERS", Map::HashMap)?;
        let mut module_map: HashMap<MapData, [u8; MODULE_KEY_LEN], u32> =
            pins::open_map(dir, "MANAGER_MODULES", Map::HashMap)?;
        let mut script_map: HashMap<MapData, [u8; MANAGER_NAME_LEN], u32> =
            pins::open_map(dir, "MANAGER_SCRIPTS", Map::HashMap)?;
        replace_entries(&mut manager_map, &keys.names).map_err(map_err("MANAGERS"))?;
        replace_entries(&mut module_map, &keys.modules).map_err(map_err("MANAGER_MODULES"))?;
        replace_entries(&mut script_map, &keys.scripts).map_err(map_err("MANAGER_SCRIPTS"))?;
        pins.claim()?;
        let restored_paths = pins.cred_paths();
        pins.cred_paths_kept = restored_paths.len();
        let [lost, priority_lost, marks_full] = previous.lost_seen;
        let decoder = Decoder::new();
        let programs_attached = pins::link_count(dir)?;
        let (backend, lsm) = backend::pinned_backend(dir);
        let tree_losses = TreeLosses::new(
            pins::open_map(dir, "LOST_TREES", Map::LruHashMap)?,
            Some(pins::open_map(dir, pins::LOST_REPORTED, Map::HashMap)?),
        );
        Ok(Sensor {
            _ebpf: None,
            marks: pins::open_map(dir, "MARKS", Map::HashMap)?,
            task_marks: TaskMarks::open_pinned(dir)?,
            events: pins::open_map(dir, "EVENTS", Map::RingBuf)?,
            priority: pins::open_map(dir, "PRIORITY", Map::RingBuf)?,
            lost: pins::open_map(dir, "LOST", Map::PerCpuArray)?,
            config_map,
            config,
            cred_map: pins::open_map(dir, "CRED_INODES", Map::HashMap)?,
            spared_map: pins::open_map(dir, "SPARED_EXES", Map::HashMap)?,
            protected: None,
            credentials: None,
            dir_watch: None,
            last_scan: Instant::now(),
            waker: None,
            restored_paths,
            canary: None,
            next_canary: Instant::now() + CANARY_INTERVAL,
            last_drain: None,
            last_read: None,
            adopted_gap_end_ns: 0,
            heartbeat: pins::open_map(dir, "HEARTBEAT", Map::Array)?,
            next_beat: Instant::now(),
            tree_losses,
            decoder,
            stats: SensorStats { lost, priority_lost, marks_full, ..SensorStats::default() },
            pins: Some(pins),
            gap: Some(Gap {
                since_ns: decoder.wall_ns(previous.heartbeat_ns),
                until_ns: decoder.wall_ns(until_boot_ns),
                clean_stop: previous.clean_stop == 1,
                previous_pid: previous.agent_tgid,
            }),
            programs_attached,
            _links: Vec::new(),
            backend,
            lsm,
            fallback: None,
            // Those the loading agent left out: decided from BTF alone, the same now.
            unwatched: match backend {
                Backend::Fentry => btf::Btf::from_sys_fs().map(|btf| fentry_hooks(&btf).1).unwrap_or_default(),
                _ => Vec::new(),
            },
            hierarchies,
        })
    }

    /// Loads and attaches the programs; with `pin_to`, pins the maps the agent reads and the
    /// links there (a set being built), so that the programs stay attached without the agent.
    fn load(
        managers: &[Manager],
        auto_roots: bool,
        pin_to: Option<&Path>,
        options: SensorOptions,
    ) -> Result<Sensor, SensorError> {
        ensure_tracefs()?;
        raise_memlock()?;
        let keys = manager_keys(managers)?;
        let decoder = Decoder::new();
        let hierarchies = cgroups::Hierarchies::of_this_namespace().map_err(SensorError::Proc)?;
        let want_fentry = options.backend != Backend::Tracepoint;
        let Opened { mut offsets, cgroup_subsys, btf, mut ebpf, globals, aya_btf, fork_btf } =
            open_object(kernel_object()?, &options, &hierarchies, want_fentry)?;
        let task_marks = TaskMarks::take(&mut ebpf, &globals)?;
        // Without the registers' layout the fentry programs cannot read a syscall's arguments.
        let regs = btf.as_ref().map(|btf| offsets::syscall_regs(btf, &mut offsets).map_err(|e| e.to_string()));
        if let Some(dir) = pin_to {
            for &name in pins::PINNED_MAPS {
                let map = ebpf.map(name).ok_or(SensorError::Missing { what: "map", name })?;
                let path = dir.join(name);
                map.pin(&path).map_err(|source| SensorError::Pin { path, source })?;
            }
            task_marks.pin(dir)?;
        }
        let lineage = raw_tracepoints(globals.on());

        let uring = uring_tracepoint();
        let mut config = Config {
            offsets,
            flags: if auto_roots { config_flag::AUTO_ROOTS } else { 0 },
            agent_tgid: std::process::id(),
            uring_opcode_offset: uring.map_or(0, uring_opcode_offset),
            block_syscalls: 0,
            spare_root_managers: 0,
            cgroup_subsys,
            cgroup_v2: u32::from(hierarchies.v2.is_some()),
            lsm_syscalls: 0,
            agent_roots: 0,
        };
        let mut config_map: Array<MapData, Config> = take_typed(&mut ebpf, "CONFIG")?;
        config_map.set(0, config, 0).map_err(map_err("CONFIG"))?;
        let _manager_maps = fill_managers(&mut ebpf, &keys)?;
        let lost: PerCpuArray<MapData, u64> = take_typed(&mut ebpf, "LOST")?;
        let cred_map: HashMap<MapData, InodeKey, CredInode> = take_typed(&mut ebpf, "CRED_INODES")?;
        let spared_map: HashMap<MapData, InodeKey, SparedExe> = take_typed(&mut ebpf, "SPARED_EXES")?;
        let marks: HashMap<MapData, u32, Mark> = take_typed(&mut ebpf, "MARKS")?;
        let lost_trees: HashMap<MapData, u32, LostTree> = take_typed(&mut ebpf, "LOST_TREES")?;
        let heartbeat: Array<MapData, u64> = take_typed(&mut ebpf, "HEARTBEAT")?;

        let has_tracepoint =
            |category: &str, name: &str| Path::new(TRACEFS).join("events").join(category).join(name).is_dir();
        // fentry first: where it does not load, `auto` falls back to the tracepoints.
        let mut fallback = None;
        let mut unwatched = Vec::new();
        let mut tracing_links = Vec::new();
        let mut lsm = false;
        let mut backend = Backend::Tracepoint;
        if options.backend != Backend::Tracepoint {
            let attempt = regs
                .unwrap_or(Err(String::new()))
                .map_err(|e| format!("struct pt_regs: {e}"))
                .and_then(|()| {
                    aya_btf.as_ref().ok_or_else(String::new)?.as_ref().map_err(|e| format!("kernel BTF: {e}"))
                })
                .and_then(|aya_btf| {
                    // Kept whenever the fentry backend is wanted (see open_object).
                    let (hooks, unwatched) = fentry_hooks(btf.as_ref().ok_or_else(String::new)?);
                    let lsm_active = options.enforce && backend::bpf_lsm_active().unwrap_or(false);
                    let (mut work, lsm_syscalls) = fentry_work(&hooks, lsm_active);
                    // The raw tracepoints (and io_uring's) both backends run load meanwhile,
                    // on the same threads: exec's (two path walks) right after the open exit.
                    let plain = lineage.iter().chain(uring.map(|_| &URING_PROGRAM));
                    for (at, &program) in plain.enumerate() {
                        work.insert((at + 1).min(work.len()), backend::Work { program, targets: Vec::new() });
                    }
                    backend::load_tracing(&mut ebpf, work, aya_btf)
                        .map(|links| (hooks, unwatched, links, lsm_syscalls))
                        .map_err(|e| e.to_string())
                });
            match attempt {
                Ok((hooks, left_out, links, lsm_syscalls)) => {
                    fill_syscalls(&mut ebpf, &hooks)?;
                    unwatched = left_out;
                    tracing_links = links;
                    lsm = lsm_syscalls != 0;
                    config.lsm_syscalls = lsm_syscalls;
                    config_map.set(0, config, 0).map_err(map_err("CONFIG"))?;
                    backend = Backend::Fentry;
                }
                Err(why) if options.backend == Backend::Auto => fallback = Some(why),
                Err(why) => return Err(SensorError::Fentry(why)),
            }
        }
        let hooks: Vec<SyscallHook> = if backend == Backend::Tracepoint {
            let hooks: Vec<SyscallHook> = syscall_hooks()
                .into_iter()
                .filter(|hook| hook.required || has_tracepoint("syscalls", &format!("sys_enter_{}", hook.name)))
                .collect();
            fill_syscalls(&mut ebpf, &hooks)?;
            hooks
        } else {
            Vec::new()
        };
        // Both parses of the kernel's BTF are done with: dropped before the verifier's wait, and
        // before the rings are mapped (4.5 MiB resident at once), so that they do not add to the
        // start-up peak.
        drop(btf);
        drop(aya_btf);
        if globals.on() {
            load_fork_btf(&mut ebpf, fork_btf.as_ref())?;
        }
        drop(fork_btf);
        let wanted = tracepoint_programs(&lineage, &hooks, uring);
        load_programs(&mut ebpf, &wanted)?;
        kernel_log::start_reader(&mut ebpf);
        let events: super::ring::Ring = take_typed(&mut ebpf, "EVENTS")?;
        let priority: super::ring::Ring = take_typed(&mut ebpf, "PRIORITY")?;
        let (programs_attached, links) =
            attach_programs(&mut ebpf, pin_to, tracing_links, (&lineage, &hooks, uring), &globals)?;
        let pins = pin_to.map(Pins::create).transpose()?;
        let kept = pin_to.map(|dir| pins::open_map(dir, pins::LOST_REPORTED, Map::HashMap)).transpose()?;
        Ok(Sensor {
            _ebpf: Some(ebpf),
            marks,
            task_marks,
            events,
            priority,
            lost,
            config_map,
            config,
            cred_map,
            spared_map,
            protected: None,
            credentials: None,
            dir_watch: None,
            last_scan: Instant::now(),
            waker: None,
            restored_paths: Vec::new(),
            canary: None,
            next_canary: Instant::now() + CANARY_INTERVAL,
            last_drain: None,
            last_read: None,
            adopted_gap_end_ns: 0,
            heartbeat,
            next_beat: Instant::now(),
            tree_losses: TreeLosses::new(lost_trees, kept),
            decoder,
            stats: SensorStats::default(),
            pins,
            gap: None,
            programs_attached,
            _links: links,
            backend,
            lsm,
            fallback,
            unwatched,
            hierarchies,
        })
    }
}

/// The object loaded and the kernel's BTF parsed (see [`Sensor::load`]).
struct Opened {
    offsets: KernelOffsets,
    cgroup_subsys: u32,
    /// credwatch's own parse, kept only for the fentry backend (its registers and hooks).
    btf: Option<btf::Btf>,
    ebpf: Ebpf,
    globals: Globals,
    /// aya's own parse, when the fentry backend is wanted.
    aya_btf: Option<Result<AyaBtf, String>>,
    /// Fork's tracepoint as aya looks it up, where marks are kept in task storage (see
    /// [`btf::Btf::aya_typedef`]).
    fork_btf: Option<Result<AyaBtf, String>>,
}

/// Loads `object` sized by `options`. aya's loader parses the kernel BTF whatever it is told
/// (the programs carry no CO-RE relocations: offsets come through CONFIG), and so does the
/// offset resolver: both at once, on two threads, since start-up time is what `credwatch run`
/// adds to a command. The fentry backend's loads (their attach targets) need aya's own parse
/// of the BTF: on a third, when `want_fentry`. Fork's BTF-typed program takes only its
/// tracepoint's id, which the offset resolver gives aya.
fn open_object(
    object: &'static [u8],
    options: &SensorOptions,
    hierarchies: &cgroups::Hierarchies,
    want_fentry: bool,
) -> Result<Opened, SensorError> {
    let kernel = KernelVersion::current().ok();
    let ((offsets, cgroup_subsys, btf, fork_btf), (ebpf, globals), aya_btf) = std::thread::scope(|scope| {
        let (globals_sent, globals_received) = std::sync::mpsc::channel::<Globals>();
        let loader = scope.spawn(move || {
            // The verifier takes the level as a constant and drops the log calls above it.
            let level = kernel_log::level_byte();
            // aya 0.14 parses the kernel's BTF here whatever is asked after (`btf(None)` drops
            // it): begun at once, that parse runs beside credwatch's own instead of after it.
            let mut loader = EbpfLoader::new();
            // Two offsets from the BTF parse below: the load waits for it.
            let globals = globals_received.recv().unwrap_or_default();
            loader.btf(None).override_global(aya_log::LEVEL, &level, true);
            let _stand_in = globals.prepare(&mut loader)?;
            for (name, size) in options.map_sizes.iter() {
                loader.map_max_entries(name, size);
                // One entry per marked process, as MARKS (the kernel's repeats.rs).
                if name == "MARKS" {
                    loader.map_max_entries("PROCESS_REPEATS", size);
                }
            }
            Ok::<_, SensorError>((loader.load(object)?, globals))
        });
        let aya_btf = want_fentry.then(|| scope.spawn(AyaBtf::from_sys_fs));
        let offsets = btf::Btf::from_sys_fs()
            .and_then(|btf| Ok((offsets::kernel_offsets(&btf)?, hierarchies.subsys_index(&btf)?, btf)));
        let globals = Globals::resolve(kernel, offsets.as_ref().ok().map(|(_, _, btf)| btf));
        let fork_typedef = format!("btf_trace_{FORK_TRACEPOINT}");
        // Dropped before aya's loader parses the BTF again (see the start-up peak in load).
        let offsets = offsets.map(|(offsets, subsys, btf)| {
            let fork_btf = globals.on().then(|| btf.aya_typedef(&fork_typedef).map_err(|e| e.to_string()));
            (offsets, subsys, want_fentry.then_some(btf), fork_btf)
        });
        let _ = globals_sent.send(globals);
        let ebpf = loader.join().map_err(|_| SensorError::LoaderPanicked)?;
        let aya_btf = aya_btf
            .map(|thread| thread.join().map_err(|_| SensorError::LoaderPanicked))
            .transpose()?
            .map(|parsed| parsed.map_err(|e| e.to_string()));
        Ok::<_, SensorError>((offsets?, ebpf?, aya_btf))
    })?;
    Ok(Opened { offsets, cgroup_subsys, btf, ebpf, globals, aya_btf, fork_btf })
}

/// The kernel's tables of managers, taken from the object.
type ManagerMaps = (
    HashMap<MapData, [u8; MANAGER_NAME_LEN], ManagerValue>,
    HashMap<MapData, [u8; MODULE_KEY_LEN], u32>,
    HashMap<MapData, [u8; MANAGER_NAME_LEN], u32>,
);

/// Fills the kernel's tables of managers (`MANAGERS`, `MANAGER_MODULES`, `MANAGER_SCRIPTS`).
/// The caller holds them until the programs are loaded: a taken map is closed when dropped, and
/// a program loaded after would refer to a closed fd.
fn fill_managers(ebpf: &mut Ebpf, keys: &ManagerKeys) -> Result<ManagerMaps, SensorError> {
    let mut manager_map: HashMap<_, [u8; MANAGER_NAME_LEN], ManagerValue> = take_typed(ebpf, "MANAGERS")?;
    for (key, value) in &keys.names {
        manager_map.insert(key, value, 0).map_err(map_err("MANAGERS"))?;
    }
    let mut module_map: HashMap<_, [u8; MODULE_KEY_LEN], u32> = take_typed(ebpf, "MANAGER_MODULES")?;
    for (key, value) in &keys.modules {
        module_map.insert(key, value, 0).map_err(map_err("MANAGER_MODULES"))?;
    }
    let mut script_map: HashMap<_, [u8; MANAGER_NAME_LEN], u32> = take_typed(ebpf, "MANAGER_SCRIPTS")?;
    for (key, value) in &keys.scripts {
        script_map.insert(key, value, 0).map_err(map_err("MANAGER_SCRIPTS"))?;
    }
    Ok((manager_map, module_map, script_map))
}

/// The tracepoint programs to load: the lineage's, those of `hooks` and io_uring's, the costliest
/// to verify first (see [`load_programs`]).
fn tracepoint_programs(
    lineage: &[&'static str],
    hooks: &[SyscallHook],
    uring: Option<&'static str>,
) -> Vec<&'static str> {
    let mut wanted: Vec<&'static str> = lineage.to_vec();
    for hook in hooks {
        let (enter, exit) = hook_programs(hook);
        for program in std::iter::once(enter).chain(exit) {
            if !wanted.contains(&program) {
                wanted.push(program);
            }
        }
    }
    if uring.is_some() {
        wanted.push(URING_PROGRAM);
    }
    // Costliest to verify first (see load_programs); the sort is stable.
    wanted.sort_by_key(|name| {
        COSTLIEST_TO_VERIFY.iter().position(|costly| costly == name).unwrap_or(COSTLIEST_TO_VERIFY.len())
    });
    wanted
}

/// Loads fork's BTF-typed program (where marks are kept in task storage), which needs aya's
/// view of its attach target (see [`btf::Btf::aya_typedef`]).
fn load_fork_btf(ebpf: &mut Ebpf, fork_btf: Option<&Result<AyaBtf, String>>) -> Result<(), SensorError> {
    let aya_btf = match fork_btf {
        Some(Ok(aya_btf)) => aya_btf,
        Some(Err(why)) => return Err(SensorError::ForkBtf(why.clone())),
        None => return Err(SensorError::ForkBtf(String::new())),
    };
    fork_btf_program(ebpf)?.load(FORK_TRACEPOINT, aya_btf).map_err(program_err(FORK_BTF))
}

fn fork_btf_program(ebpf: &mut Ebpf) -> Result<&mut BtfTracePoint, SensorError> {
    let name = FORK_BTF;
    ebpf.program_mut(name).ok_or(SensorError::Missing { what: "program", name })?.try_into().map_err(program_err(name))
}

/// Attaches the loaded programs: the fentry backend's links (`tracing_links`), fork's BTF-typed
/// program where marks are kept in task storage, the lineage's raw tracepoints, the syscall
/// tracepoints of `hooks` and io_uring's. With `pin_to`, each link is pinned there, else the
/// fentry backend's are returned to be held. Returns the count of programs attached.
fn attach_programs(
    ebpf: &mut Ebpf,
    pin_to: Option<&Path>,
    tracing_links: Vec<backend::NamedLink>,
    (lineage, hooks, uring): (&[&'static str], &[SyscallHook], Option<&'static str>),
    globals: &Globals,
) -> Result<(u64, Vec<FdLink>), SensorError> {
    let mut programs_attached = tracing_links.len() as u64;
    // A pinned link keeps its program attached once this process has closed it.
    let pin_link = |name: &'static str, tracepoint: &str, link: Result<FdLink, _>| -> Result<(), SensorError> {
        let Some(dir) = pin_to else { return Ok(()) };
        let path = dir.join(format!("link_{tracepoint}"));
        let link = link.map_err(|source| SensorError::Link { name, source })?;
        link.pin(&path).map_err(|source| SensorError::Pin { path, source })?;
        Ok(())
    };
    let mut links = Vec::new();
    for (name, link) in tracing_links {
        match pin_to {
            Some(dir) => {
                let path = dir.join(format!("link_{name}"));
                link.pin(&path).map_err(|source| SensorError::Pin { path, source })?;
            }
            None => links.push(link),
        }
    }
    if globals.on() {
        let name = FORK_BTF;
        let program = fork_btf_program(ebpf)?;
        let link = program.attach().map_err(program_err(name))?;
        programs_attached += 1;
        if pin_to.is_some() {
            pin_link(name, FORK_TRACEPOINT, Ok(FdLink::from(program.take_link(link).map_err(program_err(name))?)))?;
        }
    }
    for &name in lineage {
        let program: &mut RawTracePoint = ebpf
            .program_mut(name)
            .ok_or(SensorError::Missing { what: "program", name })?
            .try_into()
            .map_err(program_err(name))?;
        let link = program.attach(name).map_err(program_err(name))?;
        programs_attached += 1;
        if pin_to.is_some() {
            pin_link(name, name, Ok(FdLink::from(program.take_link(link).map_err(program_err(name))?)))?;
        }
    }
    let mut attach = |name: &'static str, category: &'static str, tracepoint: String| -> Result<(), SensorError> {
        programs_attached += 1;
        let loaded: &mut TracePoint = ebpf
            .program_mut(name)
            .ok_or(SensorError::Missing { what: "program", name })?
            .try_into()
            .map_err(program_err(name))?;
        match loaded.attach(category, &tracepoint) {
            Ok(link) if pin_to.is_some() => {
                let link = loaded.take_link(link).map_err(program_err(name))?;
                pin_link(name, &tracepoint, FdLink::try_from(link))
            }
            Ok(_) => Ok(()),
            Err(source) => Err(SensorError::Attach { name, category, tracepoint, source: Box::new(source) }),
        }
    };
    for hook in hooks {
        let (enter, exit) = hook_programs(hook);
        attach(enter, "syscalls", format!("sys_enter_{}", hook.name))?;
        if let Some(exit) = exit {
            attach(exit, "syscalls", format!("sys_exit_{}", hook.name))?;
        }
    }
    if let Some(tracepoint) = uring {
        attach(URING_PROGRAM, "io_uring", tracepoint.to_owned())?;
    }
    Ok((programs_attached, links))
}

/// Makes `map` hold exactly `entries`.
pub(super) fn replace_entries<K: aya::Pod + Eq, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    entries: &[(K, V)],
) -> Result<(), MapError> {
    let stale: Vec<K> =
        map.keys().filter_map(Result::ok).filter(|key| !entries.iter().any(|(k, _)| k == key)).collect();
    for key in stale {
        map.remove(&key)?;
    }
    for (key, value) in entries {
        map.insert(key, value, 0)?;
    }
    Ok(())
}

pub(super) fn take_typed<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, SensorError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(SensorError::Missing { what: "map", name })?;
    T::try_from(map).map_err(map_err(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use credwatch_core::rules::manager::{ModuleRoot, ScriptRoot};

    #[test]
    fn builds_kernel_keys_for_execs_modules_and_scripts() {
        let managers = vec![
            Manager { name: "npm".into(), execs: vec!["npm".into()], ..Manager::default() },
            Manager {
                name: "pip".into(),
                execs: vec!["pip3".into()],
                modules: vec![ModuleRoot {
                    interpreters: vec!["python3".into()],
                    args: vec!["-m".into(), "pip".into()],
                }],
                scripts: vec![ScriptRoot {
                    interpreters: vec!["python3".into()],
                    files: vec!["__pip-runner__.py".into()],
                    args: vec![],
                }],
                ..Manager::default()
            },
            Manager {
                name: "yarn".into(),
                scripts: vec![ScriptRoot {
                    interpreters: vec!["node".into(), "npm".into()],
                    files: vec!["yarn-*.cjs".into(), "yarn.js".into()],
                    args: vec![],
                }],
                ..Manager::default()
            },
        ];
        let keys = manager_keys(&managers).unwrap();
        assert_eq!(keys.names.len(), 4);
        assert_eq!(&keys.names[0].0[..4], b"npm\0");
        // npm is a plain exec: a yarn script run by "npm" does not make it an interpreter.
        assert_eq!(keys.names[0].1, ManagerValue { manager: 0, flags: 0 });
        assert_eq!(&keys.names[2].0[..8], b"python3\0");
        let both = manager_flag::NEEDS_MODULE | manager_flag::NEEDS_SCRIPT;
        assert_eq!(keys.names[2].1, ManagerValue { manager: 1, flags: both });
        assert_eq!(&keys.names[3].0[..5], b"node\0");
        assert_eq!(keys.names[3].1, ManagerValue { manager: 2, flags: manager_flag::NEEDS_SCRIPT });
        assert_eq!(&keys.modules[0].0[..8], b"-m\0pip\0\0");
        assert_eq!(keys.modules[0].1, 1);
        let scripts: Vec<(&[u8], u32)> = keys.scripts.iter().map(|(key, m)| (&key[..6], *m)).collect();
        assert_eq!(scripts, [(&b"__pip\0"[..], 1), (&b"yarn\0\0"[..], 2)]);

        let long =
            vec![Manager { name: "x".into(), execs: vec!["a-very-long-exec-name".into()], ..Manager::default() }];
        let error = manager_keys(&long).unwrap_err().to_string();
        assert!(error.contains("a-very-long-exec-name"), "{error}");
    }
    #[test]
    fn the_kernel_marks_coding_agents_by_the_managers_keys() {
        let rules = credwatch_core::rules::RuleSet::defaults().unwrap();
        let keys = manager_keys(&rules.kernel_roots()).unwrap();
        let index = |name: &str| {
            let key: [u8; MANAGER_NAME_LEN] = padded_key(name.as_bytes()).unwrap();
            keys.names.iter().find(|(k, _)| *k == key).map(|(_, value)| (value.manager, value.flags))
        };
        let managers = rules.managers().len() as u32;
        for (i, agent) in rules.agents().iter().enumerate() {
            for exec in &agent.execs {
                // After the managers: their indexes (the spare masks') stay what they were.
                assert_eq!(index(exec), Some((managers + i as u32, 0)), "{exec}");
            }
        }
        assert_eq!(
            index("npm").map(|(m, _)| m),
            rules.managers().iter().position(|m| m.name == "npm").map(|i| i as u32)
        );
        let codex = rules.agents().iter().position(|a| a.name == "codex").unwrap() as u32;
        let stem: [u8; MANAGER_NAME_LEN] = padded_key(b"codex").unwrap();
        assert!(keys.scripts.contains(&(stem, managers + codex)));
    }
}
