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
static HELD_US: OnceLock<i32> = OnceLock::new();

/// Hold a request of `us` microseconds (the kernel's range: 0 to
/// 2,000,000,000, which the option's parser enforces). The file is opened
/// close-on-exec: a tool's process never inherits it.
pub fn hold(us: i32) -> io::Result<Held> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{DEVICE}: {e}"));
    let mut file = OpenOptions::new().write(true).open(DEVICE).map_err(named)?;
    file.write_all(&us.to_ne_bytes()).map_err(named)?;
    let _ = HELD_US.set(us);
    Ok(Held { _file: file })
}

/// The request this process holds, if any.
pub fn held_us() -> Option<i32> {
    HELD_US.get().copied()
}
