//! The kernel programs' own diagnostics (`--kernel-log`): what went wrong on their side (a
//! failed read, a walk cut short by its limit, a full map or ring buffer), with the values a
//! user on an unfamiliar kernel can send. The programs write them with aya-log; the level is a
//! global of the object set before load, which the verifier takes as a constant, so that the
//! log calls above it are dead code it removes: off (the default) costs nothing measurable.
//! The lines go to the agent's log, as `kernel: ...` (JSON: `"kernel": true`).

use std::{
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicU8, Ordering},
    thread,
};

use aya::Ebpf;
use aya_log::EbpfLogger;
pub use aya_log::Level;

/// 0: off; else the least severe [`Level`] the programs write.
static LEVEL: AtomicU8 = AtomicU8::new(0);

/// Sets the level of the kernel log of the programs loaded from now on (`None`: off).
pub fn set_level(level: Option<Level>) {
    LEVEL.store(level.map_or(0, |level| level as u8), Ordering::Relaxed);
}

/// The value of the programs' `AYA_LOG_LEVEL`.
pub(crate) fn level_byte() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

/// Starts a thread that writes the programs' log lines to the agent's log, when the log is on.
/// A failure to start it is itself logged: the sensor works without it.
pub(crate) fn start_reader(ebpf: &mut Ebpf) {
    if level_byte() == 0 {
        return;
    }
    let mut logger = match EbpfLogger::init_with_logger(ebpf, KernelLines) {
        Ok(logger) => logger,
        Err(error) => {
            tracing::warn!("the kernel log cannot be read: {error}");
            return;
        }
    };
    let spawned = thread::Builder::new().name("kernel-log".into()).spawn(move || {
        let fd = logger.as_raw_fd();
        loop {
            let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd; the ring buffer's fd lives as long as the logger.
            if unsafe { libc::poll(&mut poll, 1, 1000) } < 0
                && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
            {
                return;
            }
            logger.flush();
        }
    });
    if let Err(error) = spawned {
        tracing::warn!("the kernel log cannot be read: {error}");
    }
}

/// Writes aya-log's records as the agent's log records. The level chosen with `--kernel-log`
/// is the filter: debug and trace lines are written at info, so that they show without
/// `--log-level debug` too.
struct KernelLines;

impl log::Log for KernelLines {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        // The module of the kernel programs that wrote it (`credwatch::path`): which hook family.
        let module = record.module_path().unwrap_or("?");
        let level = record.level().as_str();
        match record.level() {
            log::Level::Error => {
                tracing::error!(kernel = true, kernel_level = level, module, "kernel: {module}: {}", record.args())
            }
            log::Level::Warn => {
                tracing::warn!(kernel = true, kernel_level = level, module, "kernel: {module}: {}", record.args())
            }
            _ => tracing::info!(
                kernel = true,
                kernel_level = level,
                module,
                "kernel {}: {module}: {}",
                level.to_lowercase(),
                record.args()
            ),
        }
    }

    fn flush(&self) {}
}
