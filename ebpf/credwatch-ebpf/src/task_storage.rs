//! A task storage map (`BPF_MAP_TYPE_TASK_STORAGE`, Linux 5.11; usable from tracing programs
//! since 5.12): a value kept in the `struct task_struct` itself, found without hashing.
//! aya-ebpf 0.2.1 has BTF-defined cgroup, inode and socket storage but not this one, so its
//! definition is spelled here as `btf_map_def!` would: the loader reads the type, key, value,
//! size and flags from the BTF of these placeholder pointers.

use core::ptr;

use aya_ebpf::{
    bindings::{
        bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE, task_struct, BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE,
    },
    helpers::generated::bpf_task_storage_get,
};

/// The definition of a task storage map of `T`: no preallocation and no size (one value per
/// task that has one), an `int` key (a pidfd, from userspace).
#[repr(C)]
pub(crate) struct TaskStorage<T> {
    r#type: *const [i32; BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders for the BTF, never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub(crate) const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            map_flags: ptr::null(),
        }
    }

    /// `task`'s value, if it has one.
    ///
    /// # Safety
    ///
    /// `task` is a BTF pointer to a task (the verifier checks it).
    #[inline(always)]
    pub(crate) unsafe fn get(&self, task: *mut task_struct) -> Option<*mut T> {
        // SAFETY: the map is this definition; the verifier checks `task`.
        let value = unsafe { bpf_task_storage_get(self as *const Self as *mut _, task, ptr::null_mut(), 0) };
        (!value.is_null()).then_some(value.cast())
    }

    /// Gives `task` the value `value` unless it has one; false when it could not (no memory).
    ///
    /// # Safety
    ///
    /// `task` is a BTF pointer to a task (the verifier checks it).
    #[inline(always)]
    pub(crate) unsafe fn get_or_insert(&self, task: *mut task_struct, value: &mut T) -> bool {
        // SAFETY: as in `get`; the kernel copies `value`.
        let stored = unsafe {
            bpf_task_storage_get(
                self as *const Self as *mut _,
                task,
                value as *mut T as *mut _,
                BPF_LOCAL_STORAGE_GET_F_CREATE as u64,
            )
        };
        !stored.is_null()
    }
}
