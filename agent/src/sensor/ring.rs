//! A BPF ring buffer's consumer that maps the data area once.
//!
//! aya's `RingBuf` maps the producer page and the data area twice, as the kernel allows so that
//! a record crossing the end reads contiguously. The kernel inserts every page of a ring's
//! mapping at mmap time, so each ring counted twice in the agent's RSS: the ring mappings of an
//! idle `watch` were 9232 kB resident (Rss in /proc/PID/smaps: the 4 MiB bulk ring 8196, the
//! 512 KiB priority ring 1028, the two consumer pages 4 each). Mapped once they are 4624 kB.
//! The rare record that crosses the end is copied into a reusable buffer; any other is read in
//! place.

use std::{
    ffi::c_void,
    io,
    ops::Deref,
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    ptr::NonNull,
    slice,
    sync::atomic::{fence, AtomicU32, AtomicUsize, Ordering},
};

use aya::{
    maps::{Map, MapData, MapError, MapType, RingBuf},
    sys::SyscallError,
};

/// A record's header (include/uapi/linux/bpf.h): its length, with these two flags, then the
/// kernel's page offset of the record.
const HEADER: usize = 8;
/// The record is reserved and not yet committed: nothing from it on is readable yet.
const BUSY_BIT: u32 = 1 << 31;
/// The record was discarded: skipped.
const DISCARD_BIT: u32 = 1 << 30;

/// A BPF ring buffer map read from one mapping of its data area (see the module's doc).
pub(super) struct Ring {
    map: MapData,
    reader: Reader,
    // Unmapped on drop; the reader points into them.
    _consumer_page: Mapping,
    _producer: Mapping,
}

impl Ring {
    fn new(map: MapData) -> Result<Ring, MapError> {
        let info = map.info()?;
        let map_type = info.map_type()?;
        if map_type != MapType::RingBuf {
            return Err(MapError::InvalidMapType { map_type: map_type as u32 });
        }
        // The kernel makes the data area a power of two of pages.
        let size = info.max_entries() as usize;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let fd = map.fd().as_fd();
        // The kernel allows only the consumer page to be mapped writable; the producer page and
        // the data area, read-only, may be mapped shorter than their double mapping.
        let consumer_page = Mapping::new(fd, page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = Mapping::new(fd, page + size, libc::PROT_READ, page)?;
        // SAFETY: the positions are at the start of their pages and the data area follows the
        // producer page, all in the mappings just made, held as long as the reader.
        let reader = unsafe {
            Reader::new(consumer_page.ptr.cast(), producer.ptr.cast(), producer.ptr.cast::<u8>().add(page), size)
        };
        Ok(Ring { map, reader, _consumer_page: consumer_page, _producer: producer })
    }

    /// The next record, if one is committed; the ring moves past it when it is dropped.
    pub fn next(&mut self) -> Option<Record<'_>> {
        self.reader.next()
    }
}

/// From the loaded object's map, or a pinned one's (`Map::RingBuf`).
impl TryFrom<Map> for Ring {
    type Error = MapError;

    fn try_from(map: Map) -> Result<Ring, MapError> {
        match map {
            Map::RingBuf(data) => Ring::new(data),
            // aya refuses any other kind with an error naming its type (not public otherwise),
            // and maps nothing doing so.
            other => match RingBuf::<MapData>::try_from(other) {
                Err(error) => Err(error),
                Ok(_) => unreachable!("aya takes only Map::RingBuf as a ring buffer"),
            },
        }
    }
}

/// Readable when the ring holds a record (or a busy one), for poll(2).
impl AsFd for Ring {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.map.fd().as_fd()
    }
}

/// A shared mapping of the map's fd, unmapped on drop.
struct Mapping {
    ptr: NonNull<c_void>,
    len: usize,
}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, len: usize, prot: libc::c_int, offset: usize) -> Result<Mapping, MapError> {
        let failed = |io_error| MapError::SyscallError(SyscallError { call: "mmap", io_error });
        let offset = libc::off_t::try_from(offset).map_err(|_| failed(io::Error::from(io::ErrorKind::InvalidInput)))?;
        // SAFETY: a new mapping at an address the kernel picks, of a valid fd.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), offset) };
        if ptr == libc::MAP_FAILED {
            return Err(failed(io::Error::last_os_error()));
        }
        let ptr = NonNull::new(ptr).ok_or_else(|| failed(io::Error::other("mmap returned null")))?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer referred to.
        unsafe { libc::munmap(self.ptr.as_ptr(), self.len) };
    }
}

/// The consumer's side of a ring: its position, and the producer's and the data area as the
/// kernel writes them (libbpf's `ringbuf_process_ring`, aya's `RingBuf`).
struct Reader {
    cursor: Cursor,
    producer_pos: NonNull<AtomicUsize>,
    data: NonNull<u8>,
    /// The data area's size, a power of two.
    size: usize,
    /// The producer position last read: records up to it are read without reading it again.
    produced: usize,
    /// Where a record crossing the end of the data area is made whole.
    scratch: Vec<u8>,
}

/// The consumer position, kept and published.
struct Cursor {
    consumer_pos: NonNull<AtomicUsize>,
    pos: usize,
    /// The position was published since the producer position or a busy header was last
    /// found wanting (see [`Reader::next`]).
    published: bool,
}

impl Cursor {
    /// Moves past a record of `len` bytes and publishes the position: the kernel may then
    /// reuse the record's bytes.
    fn consume(&mut self, len: usize) {
        self.pos = self.pos.wrapping_add((len + HEADER).next_multiple_of(8));
        // SAFETY: see `Reader::new`. Paired with the kernel's acquire load before it reuses
        // the record's bytes.
        unsafe { self.consumer_pos.as_ref() }.store(self.pos, Ordering::Release);
        self.published = true;
    }

    /// After a position was published, a full barrier before the next look at what the
    /// producer did: either that look sees the record the producer commits, or the producer
    /// sees the position and wakes the reader (it wakes it when the position is its record's).
    fn settle(&mut self) -> bool {
        if !std::mem::take(&mut self.published) {
            return false;
        }
        fence(Ordering::SeqCst);
        true
    }
}

impl Reader {
    /// # Safety
    ///
    /// `consumer_pos` and `producer_pos` are the ring's positions, `data` its data area of
    /// `size` bytes (a power of two, a multiple of 8), all valid and 8-byte aligned while the
    /// reader lives.
    unsafe fn new(
        consumer_pos: NonNull<AtomicUsize>,
        producer_pos: NonNull<AtomicUsize>,
        data: NonNull<u8>,
        size: usize,
    ) -> Reader {
        // An adopted ring starts where the agent before stopped.
        let pos = unsafe { consumer_pos.as_ref() }.load(Ordering::Acquire);
        Reader {
            cursor: Cursor { consumer_pos, pos, published: false },
            producer_pos,
            data,
            size,
            produced: pos,
            scratch: Vec::new(),
        }
    }

    fn next(&mut self) -> Option<Record<'_>> {
        let Reader { cursor, producer_pos, data, size, produced, scratch } = self;
        loop {
            if cursor.pos == *produced {
                cursor.settle();
                // SAFETY: see `Reader::new`. Paired with the kernel's release store once the
                // headers up to it are written.
                *produced = unsafe { producer_pos.as_ref() }.load(Ordering::Acquire);
                // Positions only grow (and wrap as unsigned longs): unequal means behind.
                if cursor.pos == *produced {
                    return None;
                }
            }
            let offset = cursor.pos & (*size - 1);
            // SAFETY: records start 8-byte aligned in the data area, their header whole in it.
            // Paired with the kernel's xchg that commits the record.
            let header = unsafe { (*data.as_ptr().add(offset).cast::<AtomicU32>()).load(Ordering::Acquire) };
            if header & BUSY_BIT != 0 {
                // Records are read in order: this one first. Looked at again once after a
                // position was published, lest the producer missed it and sends no wakeup.
                if cursor.settle() {
                    continue;
                }
                return None;
            }
            let len = (header & !(BUSY_BIT | DISCARD_BIT)) as usize;
            // The kernel reserves no record that would not fit whole.
            assert!(len + HEADER < *size, "ring record of {len} bytes in a ring of {size}");
            if header & DISCARD_BIT != 0 {
                cursor.consume(len);
                continue;
            }
            let start = (offset + HEADER) & (*size - 1);
            let first = len.min(*size - start);
            // SAFETY: `start..start + first` and `0..len - first` lie in the data area; the
            // kernel leaves the record's bytes alone until the position passes it, which only
            // dropping the record does.
            let bytes = unsafe {
                let head = slice::from_raw_parts(data.as_ptr().add(start), first);
                if first == len {
                    head
                } else {
                    scratch.clear();
                    scratch.extend_from_slice(head);
                    scratch.extend_from_slice(slice::from_raw_parts(data.as_ptr(), len - first));
                    scratch.as_slice()
                }
            };
            return Some(Record { bytes, len, cursor });
        }
    }
}

/// A record's bytes; the ring moves past it when it is dropped.
pub(super) struct Record<'a> {
    bytes: &'a [u8],
    len: usize,
    cursor: &'a mut Cursor,
}

impl Deref for Record<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        self.cursor.consume(self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring in plain memory, written as the kernel would.
    struct Synthetic {
        consumer: Box<AtomicUsize>,
        producer: Box<AtomicUsize>,
        data: Vec<u64>,
        /// Where the next record is reserved.
        reserved: usize,
    }

    impl Synthetic {
        /// A ring of `size` bytes whose positions start at `pos` (past several wraps, as in a
        /// ring used for a while).
        fn new(size: usize, pos: usize) -> Synthetic {
            Synthetic {
                consumer: Box::new(AtomicUsize::new(pos)),
                producer: Box::new(AtomicUsize::new(pos)),
                data: vec![0; size / 8],
                reserved: pos,
            }
        }

        fn reader(&mut self) -> Reader {
            let size = self.data.len() * 8;
            // SAFETY: the tests drop the reader before the ring.
            unsafe {
                Reader::new(
                    NonNull::from(&*self.consumer),
                    NonNull::from(&*self.producer),
                    NonNull::new(self.data.as_mut_ptr().cast()).unwrap(),
                    size,
                )
            }
        }

        /// Writes `bytes` at `offset` of the data area, wrapping at its end, through the same
        /// kind of pointer the reader holds.
        fn put(&mut self, offset: usize, bytes: &[u8]) {
            let size = self.data.len() * 8;
            let data = self.data.as_mut_ptr().cast::<u8>();
            for (i, byte) in bytes.iter().enumerate() {
                // SAFETY: masked into the data area.
                unsafe { data.add((offset + i) & (size - 1)).write(*byte) };
            }
        }

        fn header(&self, at: usize) -> u32 {
            let offset = at & (self.data.len() * 8 - 1);
            // SAFETY: a header, 8-byte aligned in the data area.
            unsafe { self.data.as_ptr().cast::<u8>().add(offset).cast::<u32>().read() }
        }

        /// Reserves a record and writes `body` in it, wrapping at the end; its header gets
        /// `flags`. Returns where it starts.
        fn write(&mut self, body: &[u8], flags: u32) -> usize {
            let at = self.reserved;
            self.put(at, &(body.len() as u32 | flags).to_ne_bytes());
            self.put(at + HEADER, body);
            self.reserved = at + (body.len() + HEADER).next_multiple_of(8);
            self.producer.store(self.reserved, Ordering::Release);
            at
        }

        /// Clears the busy bit of the record at `at`: committed.
        fn commit(&mut self, at: usize) {
            let header = self.header(at) & !BUSY_BIT;
            self.put(at, &header.to_ne_bytes());
        }

        fn consumed(&self) -> usize {
            self.consumer.load(Ordering::Acquire)
        }
    }

    fn body(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    #[test]
    fn several_records_are_read_in_order_and_each_is_released_when_dropped() {
        let mut ring = Synthetic::new(4096, 3 * 4096 + 64);
        let bodies = [body(1, 5), body(2, 24), body(3, 100), body(4, 1)];
        let starts: Vec<usize> = bodies.iter().map(|b| ring.write(b, 0)).collect();
        let end = ring.reserved;
        let mut reader = ring.reader();
        for (body, start) in bodies.iter().zip(&starts) {
            let record = reader.next().unwrap();
            assert_eq!(&*record, body.as_slice());
            // Not released while its bytes are read.
            assert_eq!(ring.consumed(), *start);
            drop(record);
        }
        assert!(reader.next().is_none());
        assert_eq!(ring.consumed(), end);
    }

    #[test]
    fn a_record_crossing_the_end_is_whole_and_those_after_it_read_in_place() {
        let size = 4096;
        // 24 bytes before the end: the header and 16 bytes of the body fit, the rest wraps.
        let mut ring = Synthetic::new(size, 5 * size - 24);
        let crossing = body(7, 40);
        ring.write(&crossing, 0);
        let after = body(9, 16);
        ring.write(&after, 0);
        let mut reader = ring.reader();
        assert_eq!(&*reader.next().unwrap(), crossing.as_slice());
        let record = reader.next().unwrap();
        assert_eq!(&*record, after.as_slice());
        // In place: the bytes are the ring's, past the wrapped part.
        let in_ring = ring.data.as_ptr().cast::<u8>().wrapping_add(24 + HEADER);
        assert_eq!(record.as_ptr(), in_ring);
        drop(record);
        assert_eq!(ring.consumed(), 5 * size - 24 + 48 + 24);
        // A body that ends exactly at the end does not cross.
        let mut ring = Synthetic::new(size, 2 * size - 24);
        let flush = body(3, 16);
        ring.write(&flush, 0);
        let mut reader = ring.reader();
        let record = reader.next().unwrap();
        assert_eq!(&*record, flush.as_slice());
        assert_eq!(record.as_ptr(), ring.data.as_ptr().cast::<u8>().wrapping_add(size - 16));
    }

    #[test]
    fn a_busy_record_stops_the_read_until_it_is_committed() {
        let mut ring = Synthetic::new(4096, 0);
        ring.write(&body(1, 8), 0);
        let busy = ring.write(&body(2, 8), BUSY_BIT);
        // Committed, but after the busy one.
        ring.write(&body(3, 8), 0);
        let mut reader = ring.reader();
        assert_eq!(&*reader.next().unwrap(), body(1, 8).as_slice());
        assert!(reader.next().is_none());
        assert!(reader.next().is_none());
        assert_eq!(ring.consumed(), busy);
        ring.commit(busy);
        assert_eq!(&*reader.next().unwrap(), body(2, 8).as_slice());
        assert_eq!(&*reader.next().unwrap(), body(3, 8).as_slice());
        assert!(reader.next().is_none());
    }

    #[test]
    fn a_discarded_record_is_skipped_and_released() {
        let mut ring = Synthetic::new(4096, 4096 - 16);
        // Discarded across the end.
        ring.write(&body(1, 30), DISCARD_BIT);
        let kept = ring.write(&body(2, 3), 0);
        let mut reader = ring.reader();
        let record = reader.next().unwrap();
        assert_eq!(&*record, body(2, 3).as_slice());
        assert_eq!(ring.consumed(), kept);
        drop(record);
        assert!(reader.next().is_none());
        assert_eq!(ring.consumed(), ring.reserved);
    }

    #[test]
    fn an_empty_ring_gives_nothing_and_a_record_written_later_is_read() {
        let mut ring = Synthetic::new(4096, 4096);
        let mut reader = ring.reader();
        assert!(reader.next().is_none());
        ring.write(&body(5, 12), 0);
        assert_eq!(&*reader.next().unwrap(), body(5, 12).as_slice());
        assert!(reader.next().is_none());
    }

    #[test]
    fn many_wraps_of_a_small_ring_read_every_record_whole() {
        let size = 256;
        let mut ring = Synthetic::new(size, 0);
        let mut reader = ring.reader();
        for round in 0..1000usize {
            // Lengths that are not multiples of 8, crossing the end at varying points.
            let records: Vec<Vec<u8>> =
                (0..3).map(|i| body((round + i) as u8, 1 + (round * 7 + i * 13) % 60)).collect();
            for record in &records {
                ring.write(record, 0);
            }
            for record in &records {
                assert_eq!(&*reader.next().unwrap(), record.as_slice(), "round {round}");
            }
            assert!(reader.next().is_none());
        }
        assert_eq!(ring.consumed(), ring.reserved);
        assert!(ring.reserved > 100 * size);
    }
}
