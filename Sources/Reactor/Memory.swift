#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif
import CReactor

/// The process's memory: the allocator's settings and `mlockall`, for a
/// board's `realtime.lock_memory` (issue #29).
///
/// What locking costs is what the process maps: `mlockall(MCL_CURRENT |
/// MCL_FUTURE)` reads in and pins every page of every mapping, including
/// the parts of the libraries nobody calls and the address space glibc
/// reserves (64 MiB per malloc arena, 8 MiB per thread stack). Measured on
/// the simulator board (x86_64, release, idle): 54.8 MB resident and 316 MB
/// locked, against 12.2 MB resident unlocked. Hence one arena, explicit
/// thread stacks (``OSThread``), and MCL_ONFAULT: a page is pinned when it
/// is first touched, so the locked daemon holds what the unlocked one
/// touches, and nothing it touched can be paged out under it. The servo
/// thread, which must never wait for a page, touches its stack and its code
/// paths before it serves (the servo path's warm-up, ``lockCurrentStack()``).
/// `blecontrol-bench memory` measures all of it.
public enum ProcessMemory {
    /// glibc's own starting values of the trim and mmap thresholds (128 KiB),
    /// fixed: glibc otherwise raises both after a large block is freed (the
    /// trim threshold up to 64 MiB), and what the heap keeps past it is,
    /// locked, memory held for nothing.
    public static let trimThreshold = 128 * 1024
    public static let mmapThreshold = 128 * 1024

    /// One malloc arena and fixed thresholds. Call first thing in `main`,
    /// before any thread exists: glibc gives a thread its own arena at its
    /// first allocation, and each is a 64 MiB reservation that `mlockall`
    /// counts whole, with free memory of its own that no other thread can
    /// reuse. The daemon's threads are few and allocate little (the servo
    /// path nothing once warm), so one arena costs no contention worth
    /// having several for; it is set whether or not memory is locked, so
    /// the unlocked daemon's figures are the locked one's too.
    /// Returns false when the C library refused a setting (or has no
    /// `mallopt`: musl, whose allocator has no arenas).
    @discardableResult
    public static func configureAllocator() -> Bool {
        creactor_configure_malloc(1, Int32(trimThreshold), Int32(mmapThreshold)) == 1
    }

    /// How ``lockAll()`` went.
    public enum LockOutcome: Sendable, Equatable {
        /// Locked, each page as it is first touched (MCL_ONFAULT).
        case onFault
        /// Locked whole (a kernel before Linux 4.4 has no MCL_ONFAULT): every
        /// mapping read in now.
        case whole
        /// Not locked: `mlockall`'s error.
        case failed(String)
    }

    /// `mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)`, or without
    /// MCL_ONFAULT on a kernel that refuses it (EINVAL).
    public static func lockAll() -> LockOutcome {
        if creactor_lock_all(1) == 0 { return .onFault }
        if errno == EINVAL, creactor_lock_all(0) == 0 { return .whole }
        return .failed(String(cString: strerror(errno)))
    }

    /// Reads in and locks the calling thread's whole stack (mlock), so the
    /// thread never faults on a stack page it had not touched yet. Its size
    /// is the thread's ``OSThread/stackSize``: that much becomes resident.
    /// False when the stack is unknown or the lock refused (no permission:
    /// `lockAll()` said so already).
    @discardableResult
    public static func lockCurrentStack() -> Bool {
        guard let stack = OSThread.currentStack else { return false }
        return creactor_lock_range(stack.base, stack.size) == 0
    }
}
