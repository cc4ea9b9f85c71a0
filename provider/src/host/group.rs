//! One address shared by the processes of one user, with no forwarding hop: every process's
//! device socket joins a `SO_REUSEPORT` group on ADDR:port, and a classic-BPF program attached
//! to the group (`SO_ATTACH_REUSEPORT_CBPF`) hands each datagram to the socket of the process
//! that owns its destination QP, read from the BTH (DestQP bits 23:16 = the process's *slot*).
//!
//! The kernel numbers a group's sockets by join order and, when one closes, moves the last
//! into its place; a process cannot ask for its socket's number. So a *rebalance* finds them
//! out: it sends each number k a probe datagram the program steers by its byte 1, the member
//! that receives probe k writes k into its slot of the registry, and the rebalancer attaches a
//! slot → number table built from the answers. A rebalance runs when a process joins and when
//! the set of live processes changes (a close, or a death noticed by a survivor's keeper).
//!
//! The registry is a small shared-memory file (`/dev/shm/ferroce-<addr>-<port>`, mode 0600):
//! a header (magic, the probes' nonce, the epoch, the members of the last table) and one record
//! per slot (owner pid, the socket number it answered, the epoch of that answer). Each member
//! holds a record lock on its slot's record for as long as it lives, so a survivor tells a
//! dead member from a live one with `F_OFD_GETLK`, whatever happened to the pid. The locks are
//! open-file-description locks, owned by the member's descriptor of the file rather than by
//! its process: members of one process (a device's shards) see each other as they see other
//! processes, and no other descriptor's close drops them; a forked child closes the
//! descriptors it inherited ([`Registry::close_inherited`]). Mutations of the registry are
//! serialised by `flock` on the file.
//!
//! Slot 0 is the QPNs below 0x10000, QP1 among them: the host-wide role (the General Services
//! QP, later the connection manager) belongs to the live member with the lowest slot, and the
//! table steers slot 0 to it.

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes of the registry file.
const FILE_LEN: usize = super::qptable::TABLES_END;
const MAGIC: u64 = u64::from_le_bytes(*b"FERROCE2");
const SLOTS: usize = 256;
const SLOT_LEN: usize = 64;
const SLOTS_AT: usize = 128;
/// Where the slot records end: the GSI routing tables follow (see `gsi`).
pub(super) const SLOTS_END: usize = SLOTS_AT + SLOTS * SLOT_LEN;
const H_MAGIC: usize = 0;
const H_NONCE: usize = 8;
const H_EPOCH: usize = 16;
/// 8 u32 words: the members (bit per slot) of the last table attached.
const H_MEMBERS: usize = 32;
const S_PID: usize = 0;
const S_INDEX: usize = 4;
const S_EPOCH: usize = 8;
/// u32: the UDP port of the member's forwarding socket (its address, outside the group), where
/// other members send what was meant for it (0: none).
const S_FORWARD: usize = 12;
/// Probes sent past the number of live members: sockets bound but not yet in a slot may sit
/// below a live member in the kernel's numbering.
const PROBE_SLACK: usize = 16;

/// The probe datagram: opcode byte 0xFF (a manufacturer-specific BTH opcode ferroce never
/// sends), the socket number it is for, then the registry's nonce and the epoch.
pub(crate) const PROBE_LEN: usize = 16;
const PROBE_OPCODE: u8 = 0xFF;

/// The shared registry of one address.
pub(crate) struct Registry {
    file: File,
    map: memmap2::MmapRaw,
    path: std::path::PathBuf,
}

// SAFETY: the mapping is only reached through atomic operations on aligned words (see `word`), so threads may share it.
unsafe impl Sync for Registry {}
// SAFETY: as for Sync: every access through the mapping is atomic; the file handle is an fd.
unsafe impl Send for Registry {}

fn io_err(what: &str, e: std::io::Error) -> crate::Error {
    crate::Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

impl Registry {
    /// Opens (creating if need be) the registry of `local`.
    ///
    /// # Errors
    /// [`crate::Error::Io`] if the file cannot be made or mapped, or belongs to another user.
    pub(crate) fn open(local: SocketAddr) -> crate::Result<Registry> {
        Self::open_with(local, true)
    }

    fn open_with(local: SocketAddr, create: bool) -> crate::Result<Registry> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let path = Self::path_of(local);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_err(&format!("registry {}", path.display()), e))?;
        let meta = file.metadata()?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(crate::Error::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} belongs to user {}: another user's processes share {local}; use an \
                     address of your own (another 127.x.y.z, or FERROCE_DEVICES)",
                    path.display(),
                    meta.uid()
                ),
            )));
        }
        if (meta.len() as usize) < FILE_LEN {
            file.set_len(FILE_LEN as u64)?;
        }
        let map = memmap2::MmapOptions::new()
            .len(FILE_LEN)
            .map_raw(&file)
            .map_err(|e| io_err("mapping the registry", e))?;
        Ok(Registry { file, map, path })
    }

    /// Opens `local`'s registry if a group exists there, without joining or creating it.
    ///
    /// # Errors
    /// As [`Registry::open`] (another user's file, or one that cannot be mapped).
    pub(crate) fn open_existing(local: SocketAddr) -> crate::Result<Option<Registry>> {
        match Self::open_with(local, false) {
            Ok(r) => Ok(Some(r)),
            Err(crate::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn path_of(local: SocketAddr) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/dev/shm/ferroce-{}-{}", local.ip(), local.port()))
    }

    pub(super) fn word32(&self, off: usize) -> &AtomicU32 {
        assert!(off % 4 == 0 && off + 4 <= FILE_LEN, "registry offset {off}");
        // SAFETY: `off` is 4-aligned and inside the FILE_LEN-byte mapping (checked above; the mapping is page-aligned), the mapping lives as long as `self`, and every process reaches these bytes only through atomic operations, so an atomic view of them is sound.
        unsafe { &*self.map.as_ptr().add(off).cast::<AtomicU32>() }
    }

    pub(super) fn word64(&self, off: usize) -> &AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= FILE_LEN, "registry offset {off}");
        // SAFETY: as in `word32`, for an 8-aligned 8-byte word.
        unsafe { &*self.map.as_ptr().add(off).cast::<AtomicU64>() }
    }

    pub(super) fn slot_at(slot: u8) -> usize {
        SLOTS_AT + usize::from(slot) * SLOT_LEN
    }

    /// Serialises registry mutations (the file's `flock`), until the guard drops.
    fn lock(&self) -> FlockGuard<'_> {
        // SAFETY: flock on an fd this registry owns; no memory is passed.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX) };
        FlockGuard(self)
    }

    /// As [`Registry::lock`], or `None` if another process holds it right now.
    fn try_lock(&self) -> Option<FlockGuard<'_>> {
        // SAFETY: as in `lock`.
        let r = unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        (r == 0).then_some(FlockGuard(self))
    }

    /// A record lock request (`F_OFD_GETLK`, `F_OFD_SETLK` or `F_OFD_SETLKW`) on the byte at
    /// `at`. Open-file-description locks belong to this registry's descriptor, not to the
    /// process: two registries of one process (two shards' slots) conflict with each other as
    /// two processes' do, and closing another descriptor of the file drops none of them.
    fn byte_lock(
        &self,
        at: usize,
        cmd: libc::c_int,
        ty: libc::c_short,
    ) -> (libc::c_int, libc::flock) {
        // SAFETY: all-zero is a valid `struct flock` (and `l_pid` must be 0 for OFD locks).
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = ty;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = at as libc::off_t;
        fl.l_len = 1;
        // SAFETY: `fl` is a valid flock structure for the duration of the call on our fd.
        let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), cmd, &raw mut fl) };
        (rc, fl)
    }

    /// Whether a member holds `slot` (its record lock is taken). Not meaningful for the
    /// caller's own slot (a descriptor never conflicts with its own locks).
    pub(crate) fn held(&self, slot: u8) -> bool {
        let (_, fl) = self.byte_lock(
            Self::slot_at(slot),
            libc::F_OFD_GETLK,
            libc::F_WRLCK as libc::c_short,
        );
        fl.l_type != libc::F_UNLCK as libc::c_short
    }

    /// The slots that have a live owner; `mine` is counted live.
    fn live(&self, mine: u8) -> Vec<u8> {
        (1..=255u8)
            .filter(|&s| {
                s == mine
                    || (self
                        .word32(Self::slot_at(s) + S_PID)
                        .load(Ordering::Acquire)
                        != 0
                        && self.held(s))
            })
            .collect()
    }

    /// Serialises slot claims: a record lock on the header's first byte, apart from the
    /// rebalance's `flock` (the two kinds of lock do not interact), so a process joining
    /// while another rebalances is not held up, and can answer that rebalance's probes.
    pub(super) fn claim_lock(&self) -> ClaimGuard<'_> {
        self.byte_lock(0, libc::F_OFD_SETLKW, libc::F_WRLCK as libc::c_short);
        ClaimGuard(self)
    }

    /// Claims a free slot for this process (a dead owner's slot is free); `None` if the file
    /// was removed meanwhile (open the new one).
    pub(super) fn claim(&self) -> crate::Result<Option<u8>> {
        let _g = self.claim_lock();
        if !self.current() {
            return Ok(None);
        }
        if self.word64(H_MAGIC).load(Ordering::Acquire) != MAGIC {
            let mut nonce = [0u8; 8];
            crate::mr::fill_random(&mut nonce)?;
            self.word64(H_NONCE)
                .store(u64::from_le_bytes(nonce), Ordering::Release);
            self.word64(H_MAGIC).store(MAGIC, Ordering::Release);
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        for s in 1..=255u8 {
            let pid_word = self.word32(Self::slot_at(s) + S_PID);
            if pid_word.load(Ordering::Acquire) != 0 && self.held(s) {
                continue;
            }
            if !self.try_record_lock(s) {
                continue;
            }
            pid_word.store(pid, Ordering::Release);
            self.word32(Self::slot_at(s) + S_EPOCH)
                .store(0, Ordering::Release);
            // A dead owner's forwarding port is not this one's (it sets its own once joined).
            self.word32(Self::slot_at(s) + S_FORWARD)
                .store(0, Ordering::Release);
            // A dead former owner's GSI routes and counters are not this process's.
            self.clear_routes(s);
            self.clear_page(s);
            self.clear_qps(s);
            return Ok(Some(s));
        }
        Err(crate::Error::Busy(
            "all 255 process slots of this address are taken",
        ))
    }

    /// Takes the record lock of `slot`; false if another member holds it.
    fn try_record_lock(&self, slot: u8) -> bool {
        let (rc, _) = self.byte_lock(
            Self::slot_at(slot),
            libc::F_OFD_SETLK,
            libc::F_WRLCK as libc::c_short,
        );
        rc == 0
    }

    /// Gives `slot` back (a clean close).
    pub(super) fn release(&self, slot: u8) {
        // Not live from here on, before waiting for anything: a rebalance running now must
        // not wait for the answer of a socket that is gone.
        {
            let _c = self.claim_lock();
            self.word32(Self::slot_at(slot) + S_PID)
                .store(0, Ordering::Release);
            self.byte_lock(
                Self::slot_at(slot),
                libc::F_OFD_SETLK,
                libc::F_UNLCK as libc::c_short,
            );
        }
        // The last member removes the file (under both locks: a process that opened it
        // meanwhile sees it is stale when it claims, and opens the new one).
        let _g = self.lock();
        let _c = self.claim_lock();
        if self.live(0).is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// In a forked child: lets go of the parent's open file description of the registry,
    /// whose slot lock the child would otherwise share (an open-file-description lock lives
    /// while anything refers to the description: a descriptor, or a mapping of the file),
    /// keeping the slot of a parent that died "live". The descriptor is pointed at
    /// `/dev/null` and the mapping replaced by zeroed private memory at the same address,
    /// rather than closed and unmapped, so that an inherited object the child drops later
    /// closes nothing the child opened since and reads no unmapped page.
    pub(crate) fn close_inherited(&self) {
        let fd = self.file.as_raw_fd();
        // SAFETY: a NUL-terminated path and plain flags.
        let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if null >= 0 {
            // SAFETY: `fd` is this registry's own descriptor and `null` one just opened, both valid for the calls; dup3 atomically makes `fd` refer to /dev/null, dropping its reference to the file.
            unsafe {
                libc::dup3(null, fd, libc::O_CLOEXEC);
                libc::close(null);
            }
        }
        // SAFETY: the range is exactly this registry's own mapping (address and length from `map`); MAP_FIXED replaces it in place, so every pointer into it stays valid and reads zeroes, and the mapping's reference to the file goes.
        unsafe {
            libc::mmap(
                self.map.as_mut_ptr().cast(),
                self.map.len(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
        }
    }

    /// Whether the path still names this registry's file (the last member of a group removes
    /// it when it leaves).
    fn current(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self.file.metadata(), std::fs::metadata(&self.path)) {
            (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
            _ => false,
        }
    }

    /// The receive path saw a probe: records which socket number it reached.
    pub(crate) fn answer(&self, slot: u8, bytes: &[u8]) -> bool {
        if bytes.len() != PROBE_LEN || bytes[0] != PROBE_OPCODE {
            return false;
        }
        let nonce = u64::from_le_bytes(bytes[4..12].try_into().unwrap_or_default());
        if nonce != self.word64(H_NONCE).load(Ordering::Acquire) {
            log::debug!("a probe with a foreign nonce was dropped");
            return true;
        }
        let epoch = u32::from_le_bytes(bytes[12..16].try_into().unwrap_or_default());
        let k = u32::from(bytes[1]);
        let at = Self::slot_at(slot);
        let index = self.word32(at + S_INDEX);
        let seen = self.word32(at + S_EPOCH);
        // A member can get more than its own probe: probes past the group's size fall back to
        // the kernel's hash. Those carry numbers above every real one, so the smallest number
        // a member got in an epoch is its own.
        if seen.load(Ordering::Acquire) == epoch {
            index.fetch_min(k, Ordering::AcqRel);
        } else {
            index.store(k, Ordering::Release);
            seen.store(epoch, Ordering::Release);
        }
        true
    }

    /// The group's secret: probes and forwarded MADs carry it (only this user's processes can
    /// read the registry).
    pub(crate) fn nonce(&self) -> u64 {
        self.word64(H_NONCE).load(Ordering::Acquire)
    }

    /// Whether `slot` has a live owner (`mine` is live).
    pub(crate) fn is_live(&self, slot: u8, mine: u8) -> bool {
        slot != 0
            && (slot == mine
                || (self
                    .word32(Self::slot_at(slot) + S_PID)
                    .load(Ordering::Acquire)
                    != 0
                    && self.held(slot)))
    }

    /// Records the port of `slot`'s forwarding socket.
    pub(crate) fn set_forward_port(&self, slot: u8, port: u16) {
        self.word32(Self::slot_at(slot) + S_FORWARD)
            .store(u32::from(port), Ordering::Release);
    }

    /// The port of `slot`'s forwarding socket, if it has one.
    pub(crate) fn forward_port(&self, slot: u8) -> Option<u16> {
        let p = self
            .word32(Self::slot_at(slot) + S_FORWARD)
            .load(Ordering::Acquire);
        (p != 0).then_some(p as u16)
    }

    /// The pid recorded for `slot` (0 if free).
    pub(crate) fn pid_of(&self, slot: u8) -> u32 {
        self.word32(Self::slot_at(slot) + S_PID)
            .load(Ordering::Acquire)
    }

    fn members(&self) -> [u32; 8] {
        std::array::from_fn(|i| self.word32(H_MEMBERS + 4 * i).load(Ordering::Acquire))
    }

    fn set_members(&self, live: &[u8]) {
        let mut m = [0u32; 8];
        for &s in live {
            m[usize::from(s) / 32] |= 1 << (s % 32);
        }
        for (i, w) in m.iter().enumerate() {
            self.word32(H_MEMBERS + 4 * i).store(*w, Ordering::Release);
        }
    }
}

pub(super) struct ClaimGuard<'a>(&'a Registry);

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        // Releases the claim lock taken above.
        self.0
            .byte_lock(0, libc::F_OFD_SETLK, libc::F_UNLCK as libc::c_short);
    }
}

struct FlockGuard<'a>(&'a Registry);

impl Drop for FlockGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: unlocking the flock this guard's registry took.
        unsafe { libc::flock(self.0.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The classic-BPF steering program: probes by their byte 1; forwarded MADs (`gsi`) by their
/// byte 1 and everything else by DestQP's high byte, both through `table` (slot, socket
/// number); an unknown slot returns an out-of-range number, which the kernel answers with
/// its flow hash.
fn program(table: &[(u8, u32)]) -> Vec<libc::sock_filter> {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let ld_b = libc::BPF_LD | libc::BPF_B | libc::BPF_ABS;
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret_a = libc::BPF_RET | libc::BPF_A;
    let ret_k = libc::BPF_RET | libc::BPF_K;
    let ja = libc::BPF_JMP | libc::BPF_JA;
    let mut p = vec![
        op(ld_b, 0, 0, 0),
        op(jeq, 0, 2, u32::from(PROBE_OPCODE)),
        op(ld_b, 0, 0, 1),
        op(ret_a, 0, 0, 0),
        op(jeq, 0, 2, u32::from(super::gsi::FORWARD_OPCODE)),
        op(ld_b, 0, 0, 1),
        op(ja, 0, 0, 1),
        op(ld_b, 0, 0, 5),
    ];
    for &(slot, index) in table {
        p.push(op(jeq, 0, 1, u32::from(slot)));
        p.push(op(ret_k, 0, 0, index));
    }
    p.push(op(ret_k, 0, 0, u32::MAX));
    p
}

fn attach(fd: RawFd, prog: &mut [libc::sock_filter]) -> std::io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `prog.len()` instructions that live for the call; the kernel copies them.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&raw const fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// This process's membership of an address's group.
pub(crate) struct Membership {
    pub(crate) registry: Arc<Registry>,
    pub(crate) slot: u8,
    fd: RawFd,
    local: SocketAddr,
    /// Keeps the member socket (and so `fd`) open as long as the membership.
    socket: Option<Arc<socket2::Socket>>,
    /// The member process ([`crate::fork`]): a forked child's copy holds no slot.
    owner: u32,
}

impl Membership {
    /// Joins `local`'s group with `socket` (already bound with `SO_REUSEPORT`): claims a slot.
    ///
    /// # Errors
    /// As [`Registry::open`]; [`crate::Error::Busy`] if every slot is taken.
    pub(crate) fn join(local: SocketAddr, socket: Arc<socket2::Socket>) -> crate::Result<Self> {
        let (registry, slot) = loop {
            let registry = Arc::new(Registry::open(local)?);
            if let Some(slot) = registry.claim()? {
                break (registry, slot);
            }
        };
        log::debug!("{local}: joined the address's group in slot {slot}");
        Ok(Membership {
            registry,
            slot,
            fd: socket.as_raw_fd(),
            local,
            socket: Some(socket),
            owner: crate::fork::pid(),
        })
    }

    /// Whether the live members differ from those of the table in force.
    pub(crate) fn changed(&self) -> bool {
        let live = self.registry.live(self.slot);
        let mut m = [0u32; 8];
        for &s in &live {
            m[usize::from(s) / 32] |= 1 << (s % 32);
        }
        m != self.registry.members()
    }

    /// Finds every live member's socket number and attaches the table (see the module docs).
    /// Returns whether a consistent table was attached; `false` if another process is
    /// rebalancing right now (it will), the answers did not add up within `limit`, or
    /// `leaving` turned true: this process is closing the device, its receive path (which
    /// answers its own probe) has stopped, and a rebalance that waits for its answer would
    /// hold the registry's lock, and every other member's rebalance with it, for `limit`.
    pub(crate) fn rebalance(
        &self,
        limit: Duration,
        wait_for_lock: bool,
        leaving: &AtomicBool,
    ) -> bool {
        let _g = if wait_for_lock {
            self.registry.lock()
        } else {
            match self.registry.try_lock() {
                Some(g) => g,
                None => return false,
            }
        };
        // Joiners queue on the lock; the first one's rebalance covers every member live by
        // then, so the others find nothing left to do. A joiner skips only a table built from
        // its own answer (its slot answered the latest epoch): a slot it took over from a dead
        // member that no survivor has noticed yet looks unchanged, but is steered to the dead
        // member's old socket number.
        let answered_latest = {
            let at = Registry::slot_at(self.slot);
            let mine = self.registry.word32(at + S_EPOCH).load(Ordering::Acquire);
            mine != 0 && mine == self.registry.word32(H_EPOCH).load(Ordering::Acquire)
        };
        if !self.changed() && (!wait_for_lock || answered_latest) {
            return true;
        }
        let reg = &self.registry;
        let deadline = Instant::now() + limit;
        let mut attempt = 0u32;
        while Instant::now() < deadline {
            if leaving.load(Ordering::SeqCst) {
                log::debug!(
                    "{}: closing; the rebalance is left to the others",
                    self.local
                );
                return false;
            }
            // Dead members' slots are freed.
            for s in 1..=255u8 {
                let pid = reg.word32(Registry::slot_at(s) + S_PID);
                if s != self.slot && pid.load(Ordering::Acquire) != 0 && !reg.held(s) {
                    log::debug!("{}: slot {s} is dead; freed", self.local);
                    pid.store(0, Ordering::Release);
                }
            }
            let live = reg.live(self.slot);
            let epoch = reg.word32(H_EPOCH).fetch_add(1, Ordering::AcqRel) + 1;
            let nonce = reg.word64(H_NONCE).load(Ordering::Acquire);
            if self
                .probe((live.len() + PROBE_SLACK).min(SLOTS), nonce, epoch)
                .is_err()
            {
                return false;
            }
            // The answers: every live member's progress thread answers as soon as it runs; a
            // member still missing when the attempt ends may be a socket the kernel has not
            // closed or opened yet, so a new epoch asks again.
            // Each attempt waits a little longer (30 ms, 60 ms, … 300 ms): a loaded host
            // schedules the members' progress threads late.
            let wait = Duration::from_millis(30 * u64::from(attempt.min(9) + 1));
            attempt += 1;
            let attempt_end = (Instant::now() + wait).min(deadline);
            let answered = loop {
                let got: Vec<Option<u32>> = live
                    .iter()
                    .map(|&s| {
                        let at = Registry::slot_at(s);
                        (reg.word32(at + S_EPOCH).load(Ordering::Acquire) == epoch)
                            .then(|| reg.word32(at + S_INDEX).load(Ordering::Acquire))
                    })
                    .collect();
                if got.iter().all(Option::is_some)
                    || Instant::now() >= attempt_end
                    || leaving.load(Ordering::SeqCst)
                {
                    break got;
                }
                std::thread::sleep(Duration::from_micros(200));
            };
            let mut table: Vec<(u8, u32)> = Vec::new();
            let mut used = [false; SLOTS];
            let mut ok = true;
            for (&s, a) in live.iter().zip(&answered) {
                match a {
                    Some(k) if (*k as usize) < SLOTS && !used[*k as usize] => {
                        used[*k as usize] = true;
                        table.push((s, *k));
                    }
                    _ => ok = false,
                }
            }
            if !ok {
                log::debug!(
                    "{}: probe answers {answered:?} for slots {live:?} do not add up; again",
                    self.local
                );
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            // Slot 0 (QP1 and the low QPNs): the lowest live slot holds the host-wide role.
            if let Some(&(_, k)) = table.first() {
                table.insert(0, (0, k));
            }
            let mut prog = program(&table);
            if let Err(e) = attach(self.fd, &mut prog) {
                log::warn!("{}: attaching the steering table: {e}", self.local);
                return false;
            }
            reg.set_members(&live);
            log::debug!("{}: steering table {table:?} (epoch {epoch})", self.local);
            return true;
        }
        false
    }

    /// Sends probe k to the group for every k below `n`, from a socket outside the group.
    fn probe(&self, n: usize, nonce: u64, epoch: u32) -> std::io::Result<()> {
        let any: SocketAddr = if self.local.is_ipv4() {
            "0.0.0.0:0".parse().map_err(std::io::Error::other)?
        } else {
            "[::]:0".parse().map_err(std::io::Error::other)?
        };
        let s = crate::sys::bind_udp(any)?;
        // The probe branch must be in force before the probes: attach it with the table of
        // the last answers (what data traffic is steered by until the new table).
        let reg = &self.registry;
        let known: Vec<(u8, u32)> = reg
            .live(self.slot)
            .into_iter()
            .filter_map(|s| {
                let k = reg
                    .word32(Registry::slot_at(s) + S_INDEX)
                    .load(Ordering::Acquire);
                ((k as usize) < SLOTS).then_some((s, k))
            })
            .collect();
        attach(self.fd, &mut program(&known))?;
        for k in 0..n {
            let mut p = [0u8; PROBE_LEN];
            p[0] = PROBE_OPCODE;
            p[1] = k as u8;
            p[4..12].copy_from_slice(&nonce.to_le_bytes());
            p[12..16].copy_from_slice(&epoch.to_le_bytes());
            s.send_to(&p, self.local)?;
        }
        Ok(())
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        // The socket closes first (the runtime's other handles on it are gone by now), so the
        // survivors' rebalance, which the release starts, finds the kernel's group without it.
        // What the kernel had queued on it for other members (steered by a table that was
        // changing) is read out first and sent on to them once it is closed.
        let socket = self.socket.take();
        if !crate::fork::owned(self.owner) {
            return;
        }
        if let Some(socket) = socket {
            let queued = super::route::drain(&socket, &self.registry, self.slot, self.local, 64);
            drop(socket);
            if !queued.is_empty() {
                let sent = super::route::send_forwards(self.local, &self.registry, &queued);
                log::debug!(
                    "{}: leaving; {sent} of {} datagrams queued here for other members sent on",
                    self.local,
                    queued.len()
                );
            }
        }
        // Nobody forwards to this process any more.
        self.registry.set_forward_port(self.slot, 0);
        self.registry.release(self.slot);
        log::debug!(
            "{}: left the group (slot {}); {}",
            self.local,
            self.slot,
            self.registry.path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic-BPF program of the instructions `program` emits over `pkt`, as the
    /// kernel's reuseport hook does (an out-of-bounds load ends the program with 0).
    fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let i = prog[pc];
            let code = u32::from(i.code);
            pc += 1;
            if code == libc::BPF_LD | libc::BPF_B | libc::BPF_ABS {
                match pkt.get(i.k as usize) {
                    Some(&b) => a = u32::from(b),
                    None => return 0,
                }
            } else if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
                pc += usize::from(if a == i.k { i.jt } else { i.jf });
            } else if code == libc::BPF_JMP | libc::BPF_JA {
                pc += i.k as usize;
            } else if code == libc::BPF_RET | libc::BPF_A {
                return a;
            } else if code == libc::BPF_RET | libc::BPF_K {
                return i.k;
            } else {
                panic!("instruction {code:#x} not expected");
            }
        }
    }

    /// A member closing its device (its receive path, which answers its own probe, stopped)
    /// does not start a rebalance that would wait for that answer while holding the
    /// registry's lock (the others' rebalances wait on it: their tables stay stale and
    /// datagrams go astray meanwhile; seen as a 5 s close and a peer's RETRY_EXC_ERR among 36
    /// processes on one address). Nobody reads this socket: without the check the rebalance
    /// would probe (a new epoch) and wait out its limit.
    #[test]
    fn a_closing_member_starts_no_rebalance() {
        let local: SocketAddr = "127.0.96.7:47911".parse().unwrap();
        let _ = std::fs::remove_file(Registry::path_of(local));
        let socket = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )
        .unwrap();
        socket.set_reuse_port(true).unwrap();
        socket.bind(&local.into()).unwrap();
        let m = Membership::join(local, Arc::new(socket)).unwrap();
        let epoch = || m.registry.word32(H_EPOCH).load(Ordering::Acquire);
        let before = epoch();
        assert!(m.changed(), "a new member changes the live set");
        let leaving = AtomicBool::new(true);
        assert!(!m.rebalance(Duration::from_secs(2), true, &leaving));
        assert_eq!(epoch(), before, "a closing member sent probes");
        drop(m);
        let _ = std::fs::remove_file(Registry::path_of(local));
    }

    /// Two members of one process (a device's shards) each hold their slot against the
    /// other, as two processes do; a third descriptor of the file opened and closed drops
    /// neither's lock; a release frees exactly its own slot.
    #[test]
    fn members_of_one_process_hold_their_slots_against_each_other() {
        let local: SocketAddr = "127.0.96.8:47912".parse().unwrap();
        let _ = std::fs::remove_file(Registry::path_of(local));
        let a = Registry::open(local).unwrap();
        let sa = a.claim().unwrap().unwrap();
        let b = Registry::open(local).unwrap();
        let sb = b.claim().unwrap().unwrap();
        assert_ne!(sa, sb, "the second member took the first one's slot");
        assert!(
            a.held(sb) && b.held(sa),
            "one process's members see each other dead"
        );
        assert_eq!(a.live(sa), vec![sa, sb]);
        drop(Registry::open(local).unwrap());
        assert!(
            a.held(sb) && b.held(sa),
            "closing another descriptor dropped a slot lock"
        );
        b.release(sb);
        assert!(!a.held(sb), "a released slot still looks held");
        assert_eq!(a.live(sa), vec![sa]);
        a.release(sa);
        let _ = std::fs::remove_file(Registry::path_of(local));
    }

    /// A forked child lets go of its parent's slot lock: once the parent's own descriptor is
    /// closed (as when it dies) the slot is free although the child lives on.
    #[test]
    fn a_forked_child_does_not_keep_its_parents_slot() {
        let local: SocketAddr = "127.0.96.9:47913".parse().unwrap();
        let _ = std::fs::remove_file(Registry::path_of(local));
        let a = Registry::open(local).unwrap();
        let sa = a.claim().unwrap().unwrap();
        let observer = Registry::open(local).unwrap();
        // `go`: parent → child (EOF ends the child); `ready`: child → parent, once it let go.
        let (mut go, mut ready) = ([0; 2], [0; 2]);
        // SAFETY: `go` and `ready` are two-int arrays, what pipe(2) writes its descriptors into.
        let piped = unsafe { libc::pipe(go.as_mut_ptr()) + libc::pipe(ready.as_mut_ptr()) };
        assert_eq!(piped, 0);
        // SAFETY: the child only calls async-signal-safe functions (open, dup3, close, write, read, _exit) before it exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            a.close_inherited();
            let mut byte = 0u8;
            // SAFETY: the pipes' descriptors are the child's own copies; one byte to and from locals, then leaving without running anything of the parent's.
            unsafe {
                libc::close(go[1]);
                libc::write(ready[1], (&raw const byte).cast(), 1);
                libc::read(go[0], (&raw mut byte).cast(), 1);
                libc::_exit(0);
            }
        }
        let mut byte = 0u8;
        // SAFETY: the parent's ends of the pipes; one byte into a local.
        unsafe {
            libc::close(go[0]);
            libc::close(ready[1]);
            assert_eq!(libc::read(ready[0], (&raw mut byte).cast(), 1), 1);
        }
        assert!(observer.held(sa));
        drop(a);
        let freed = observer.held(sa);
        // SAFETY: ending the child (its read returns at EOF) and reaping it.
        unsafe {
            libc::close(go[1]);
            libc::close(ready[0]);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(
            !freed,
            "the child's inherited descriptor kept its parent's slot held"
        );
        let _ = std::fs::remove_file(Registry::path_of(local));
    }

    /// Opens a device of `shards` shards (`auto`: the default, not asked for) on `local`
    /// with `held` slots held by no live member (pid 0: neither claimable nor probed), and
    /// returns how many shards it opened.
    fn shards_opened(local: SocketAddr, held: usize, shards: usize, auto: bool) -> usize {
        let _ = std::fs::remove_file(Registry::path_of(local));
        let holders: Vec<(Registry, u8)> = (0..held)
            .map(|_| {
                let r = Registry::open(local).unwrap();
                let s = r.claim().unwrap().unwrap();
                r.word32(Registry::slot_at(s) + S_PID)
                    .store(0, Ordering::Release);
                (r, s)
            })
            .collect();
        let cfg = crate::driver::RuntimeConfig {
            local,
            engine: ferroce_transport::EndpointConfig::new(local.ip()),
            faults: None,
            pcap_path: None,
            busy_poll: false,
            trains: true,
            ecn: true,
            memory: false,
            shards,
            shards_auto: auto,
            dropped_rx: Default::default(),
        };
        let (shared, threads) = crate::driver::Shared::start(cfg).unwrap();
        let opened = shared.shard_counters().len();
        shared.stop();
        for t in threads {
            t.join().unwrap();
        }
        drop(shared);
        for (r, s) in &holders {
            r.release(*s);
        }
        let _ = std::fs::remove_file(Registry::path_of(local));
        opened
    }

    /// A device asked for three shards on an address with one slot left opens with one shard
    /// (the others' sockets are closed again), rather than failing.
    #[test]
    fn a_device_opens_with_the_shards_it_can_get() {
        let local: SocketAddr = "127.0.96.10:47914".parse().unwrap();
        assert_eq!(shards_opened(local, 254, 3, false), 1);
    }

    /// The default shards (one per core) are taken while the process's first slot is at most
    /// AUTO_SHARD_SLOTS; above, on a crowded address, one. Asked for, they are taken anyway.
    #[test]
    fn default_shards_leave_a_crowded_address_to_one_slot_a_process() {
        let local: SocketAddr = "127.0.96.11:47914".parse().unwrap();
        let edge = usize::from(crate::driver::AUTO_SHARD_SLOTS);
        // Slots 1..=edge-1 held: this device's first is AUTO_SHARD_SLOTS.
        assert_eq!(shards_opened(local, edge - 1, 3, true), 3);
        // One more held: its first is above.
        assert_eq!(shards_opened(local, edge, 3, true), 1);
        assert_eq!(shards_opened(local, edge, 3, false), 3);
    }

    #[test]
    fn steering_program_routes_probes_forwards_and_data() {
        let prog = program(&[(0, 2), (1, 2), (3, 0), (7, 1)]);
        // A probe goes to the number in its byte 1, whatever the table.
        assert_eq!(run(&prog, &[PROBE_OPCODE, 5, 0, 0, 0, 0, 0, 0]), 5);
        // A forwarded MAD by its target slot (byte 1), through the table.
        let fwd = super::super::gsi::FORWARD_OPCODE;
        assert_eq!(run(&prog, &[fwd, 7, 0, 0, 0, 0, 0, 0]), 1);
        assert_eq!(run(&prog, &[fwd, 3, 0, 0, 0, 0, 0, 0]), 0);
        assert_eq!(run(&prog, &[fwd, 9, 0, 0, 0, 0, 0, 0]), u32::MAX);
        // Data by DestQP's high byte (BTH byte 5); QP1 (slot 0) to the role holder.
        let bth = |slot: u8| [0x04, 0, 0xFF, 0xFF, 0, slot, 0, 0x11, 0, 0, 0, 0];
        assert_eq!(run(&prog, &bth(3)), 0);
        assert_eq!(run(&prog, &bth(7)), 1);
        assert_eq!(run(&prog, &bth(0)), 2);
        assert_eq!(
            run(&prog, &bth(4)),
            u32::MAX,
            "an unknown slot: the kernel's hash"
        );
    }
}
