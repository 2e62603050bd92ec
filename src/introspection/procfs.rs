//! A process' figures read from Linux's `/proc`: its `status` and `io` fields, its CPU time
//! (`stat`), its open files, and the TCP sockets of its network namespace; and the machine's
//! memory (`meminfo`). Nothing here is
//! trusted to be there or well formed: a process that has exited reads as an error, a field
//! that does not read as none.
use std::collections::HashSet;
use std::io;

/// Clock ticks per second of the CPU times in `stat` (`USER_HZ`: 100 on every Linux
/// architecture, whatever the kernel's own tick rate).
pub const USER_HZ: f64 = 100.0;

/// Which process to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    /// The process that reads (`/proc/self`).
    This,
    Id(u32),
}

impl Process {
    /// `/proc/<pid>/<file>`.
    fn path(self, file: &str) -> String {
        match self {
            Self::This => format!("/proc/self/{file}"),
            Self::Id(pid) => format!("/proc/{pid}/{file}"),
        }
    }

    /// The fields of `/proc/<pid>/status` (`VmRSS`, `Threads`, `SigCgt`, ...).
    pub fn status(self) -> io::Result<Fields> {
        std::fs::read_to_string(self.path("status")).map(Fields)
    }

    /// The fields of `/proc/<pid>/io` (`wchar`, `rchar`, ...).
    pub fn io(self) -> io::Result<Fields> {
        std::fs::read_to_string(self.path("io")).map(Fields)
    }

    /// User plus system CPU time, in clock ticks ([`USER_HZ`] a second), from
    /// `/proc/<pid>/stat`; none where it cannot be read.
    pub fn cpu_ticks(self) -> Option<u64> {
        cpu_ticks(&std::fs::read_to_string(self.path("stat")).ok()?)
    }

    /// User plus system CPU time, in seconds.
    pub fn cpu_seconds(self) -> Option<f64> {
        self.cpu_ticks().map(|ticks| ticks as f64 / USER_HZ)
    }

    /// How many files the process has open.
    pub fn open_files(self) -> io::Result<usize> {
        Ok(std::fs::read_dir(self.path("fd"))?.count())
    }

    /// The inodes of the sockets the process has open (to find its rows in [`Self::tcp`]).
    pub fn socket_inodes(self) -> io::Result<HashSet<u64>> {
        Ok(std::fs::read_dir(self.path("fd"))?
            .flatten()
            .filter_map(|entry| std::fs::read_link(entry.path()).ok())
            .filter_map(|link| {
                link.to_str()?
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            })
            .collect())
    }

    /// The TCP sockets of the process' network namespace, IPv4 and IPv6 (`net/tcp`,
    /// `net/tcp6`); a table that cannot be read adds none.
    pub fn tcp(self) -> Vec<TcpSocket> {
        ["net/tcp", "net/tcp6"]
            .into_iter()
            .filter_map(|table| std::fs::read_to_string(self.path(table)).ok())
            .flat_map(|text| tcp_table(&text))
            .collect()
    }
}

/// The machine's memory figures (`/proc/meminfo`: `MemTotal`, `MemAvailable`, ... in KiB).
pub fn meminfo() -> io::Result<Fields> {
    std::fs::read_to_string("/proc/meminfo").map(Fields)
}

/// `Name:  value` lines, as in `/proc/<pid>/status` and `/proc/<pid>/io`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fields(String);

impl Fields {
    pub fn new(text: String) -> Self {
        Self(text)
    }

    /// The value of the field `name` (without its colon), trimmed.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key == name).then_some(value.trim())
        })
    }

    /// The number the field `name` starts with (`VmRSS:  1234 kB` gives 1234: a size in KiB).
    pub fn number(&self, name: &str) -> Option<u64> {
        self.get(name)?.split_whitespace().next()?.parse().ok()
    }

    /// The field `name` read as a hexadecimal mask (`SigCgt`).
    pub fn mask(&self, name: &str) -> Option<u64> {
        u64::from_str_radix(self.get(name)?, 16).ok()
    }
}

/// utime plus stime of a `stat` line.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses; the fields after it start
    // past its last ')'. utime and stime are fields 14 and 15 of the whole line: 11 and 12
    // after the name.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// One row of a `/proc/net/tcp` table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSocket {
    pub local_port: u16,
    pub remote_port: u16,
    /// The kernel's state number: `0x01` established, `0x0A` listening, ...
    pub state: u8,
    pub inode: u64,
}

impl TcpSocket {
    pub const ESTABLISHED: u8 = 0x01;
}

/// The rows of a `/proc/net/tcp` or `tcp6` table (after its header) that read.
fn tcp_table(text: &str) -> Vec<TcpSocket> {
    let port = |address: &str| {
        let (_, port) = address.rsplit_once(':')?;
        u16::from_str_radix(port, 16).ok()
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            Some(TcpSocket {
                local_port: port(fields.get(1)?)?,
                remote_port: port(fields.get(2)?)?,
                state: u8::from_str_radix(fields.get(3)?, 16).ok()?,
                inode: fields.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_by_name() {
        let status = Fields::new(
            "Name:\tflagd-proxy (x)\nVmRSS:\t   12345 kB\nThreads:\t7\nSigCgt:\t0000000000004a02\n"
                .to_owned(),
        );
        assert_eq!(status.get("Name"), Some("flagd-proxy (x)"));
        assert_eq!(status.number("VmRSS"), Some(12345));
        assert_eq!(status.number("Threads"), Some(7));
        assert_eq!(status.number("VmHWM"), None);
        assert_eq!(status.number("Name"), None);
        assert_eq!(status.mask("SigCgt"), Some(0x4a02));
    }

    #[test]
    fn cpu_time_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0";
        assert_eq!(cpu_ticks(stat), Some(300));
        assert_eq!(cpu_ticks("42 (cut short) S 1"), None);
    }

    #[test]
    fn tcp_rows_read_with_their_ports_state_and_inode() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 123 1 0 100 0 0 10 0\n\
            1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 456 1 0 20 4 30 10 -1\n\
            garbage\n";
        assert_eq!(
            tcp_table(table),
            [
                TcpSocket {
                    local_port: 8080,
                    remote_port: 0,
                    state: 0x0A,
                    inode: 123
                },
                TcpSocket {
                    local_port: 8080,
                    remote_port: 0xD431,
                    state: TcpSocket::ESTABLISHED,
                    inode: 456
                },
            ]
        );
    }

    #[test]
    fn this_process_reads() {
        let this = Process::This;
        assert!(
            this.status()
                .expect("status")
                .number("VmRSS")
                .is_some_and(|kib| kib > 0)
        );
        assert!(this.cpu_ticks().is_some());
        assert!(this.open_files().expect("fd") > 0);
        let pid = Process::Id(std::process::id());
        assert!(pid.io().expect("io").number("wchar").is_some());
        assert!(
            meminfo()
                .expect("meminfo")
                .number("MemTotal")
                .is_some_and(|kib| kib > 0)
        );
    }
}
