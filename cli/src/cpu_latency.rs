//! `--cpu-latency-us`: a CPU latency request held for the life of the process
//! (Linux's PM QoS, `/dev/cpu_dma_latency`). While a process holds the file
//! open with a value written to it, the kernel keeps every idle core in a
//! state it leaves within that many microseconds; at 0 idle cores poll
//! instead of halting. A message between two processes then does not wait
//! for a halted core to wake, which on a virtual machine is an exit to the
//! hypervisor and back (docs/benchmarks.md, "Idle cores that poll"). The
//! kernel drops the request when the file is closed, so it ends with the
//! process, however it ends.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::sync::OnceLock;

const DEVICE: &str = "/dev/cpu_dma_latency";

/// The request, in force while this is alive.
pub struct Held {
    _file: File,
}

/// The value this process holds, once held (for the serving processes' start line).
static HELD_US: OnceLock<u32> = OnceLock::new();

/// Hold a request of `us` microseconds. The file is opened close-on-exec:
/// a tool's process never inherits it.
pub fn hold(us: u32) -> io::Result<Held> {
    let value = i32::try_from(us)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{us} µs is beyond the kernel's range")))?;
    let mut file =
        OpenOptions::new().write(true).open(DEVICE).map_err(|e| io::Error::new(e.kind(), format!("{DEVICE}: {e}")))?;
    file.write_all(&value.to_ne_bytes()).map_err(|e| io::Error::new(e.kind(), format!("{DEVICE}: {e}")))?;
    let _ = HELD_US.set(us);
    Ok(Held { _file: file })
}

/// The request this process holds, if any.
pub fn held_us() -> Option<u32> {
    HELD_US.get().copied()
}
