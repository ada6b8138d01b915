//! `process_*` metrics, read from `/proc/self` at scrape time: the names and meanings of the
//! Prometheus client libraries' process collectors (CPU seconds, resident memory, open and
//! maximum file descriptors, start time), so the usual dashboards work unchanged.
//!
//! Linux only; elsewhere, or when a file cannot be read, the family is left out of the scrape.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// `/proc/<pid>/stat` counts CPU time in clock ticks of `USER_HZ`, which the kernel fixes at
/// 100 for user space on every architecture (`sysconf(_SC_CLK_TCK)`; `include/asm-generic/
/// param.h`).
const TICKS_PER_SECOND: f64 = 100.0;

#[derive(Debug, Default)]
pub(super) struct Collector;

impl Collector {
    pub(super) fn new() -> Self {
        Self
    }
}

/// What one scrape reads.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Sample {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<i64>,
    pub virtual_bytes: Option<i64>,
    pub open_fds: Option<i64>,
    pub max_fds: Option<i64>,
    pub start_time_seconds: Option<f64>,
}

impl Sample {
    pub(super) fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let fields = stat.as_deref().and_then(stat_fields);
        let field = |i: usize| -> Option<f64> { fields.as_ref()?.get(i)?.parse().ok() };
        let boot_time = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
        // Fields after the command name, counted from `state` (field 3 of proc(5)) as 0.
        let cpu_seconds = match (field(11), field(12)) {
            (Some(u), Some(s)) => Some((u + s) / TICKS_PER_SECOND),
            _ => None,
        };
        let start_time_seconds = match (boot_time, field(19)) {
            (Some(b), Some(t)) => Some(b + t / TICKS_PER_SECOND),
            _ => None,
        };
        #[allow(clippy::cast_possible_truncation)]
        let virtual_bytes = field(20).map(|v| v as i64);
        let resident_bytes = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| status_kib(&s, "VmRSS:"))
            .map(|kib| kib * 1024);
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| i64::try_from(d.count()).unwrap_or(i64::MAX));
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| max_open_files(&s));
        Self {
            cpu_seconds,
            resident_bytes,
            virtual_bytes,
            open_fds,
            max_fds,
            start_time_seconds,
        }
    }
}

/// The fields of `/proc/self/stat` after `(comm)`; comm may hold spaces and parentheses, so
/// the split is at the last `)`.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().collect())
}

fn status_kib(status: &str, key: &str) -> Option<i64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn max_open_files(limits: &str) -> Option<i64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    soft.parse().ok()
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = Sample::read();
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                m.metric_type(),
            )?)?;
        }
        let gauges: [(&str, &str, Option<i64>); 4] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds,
            ),
        ];
        for (name, help, v) in gauges {
            if let Some(v) = v {
                let m = ConstGauge::new(v);
                m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
            }
        }
        if let Some(v) = s.start_time_seconds {
            let m = ConstGauge::new(v);
            m.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                None,
                m.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{max_open_files, stat_fields, status_kib, Sample};

    #[test]
    fn parses_proc_formats() {
        let stat = "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 \
                    1234 10485760 300 18446744073709551615";
        let f = stat_fields(stat).expect("fields");
        assert_eq!(f[0], "S");
        assert_eq!(
            (f[11], f[12], f[19], f[20]),
            ("250", "50", "1234", "10485760")
        );
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t   5120 kB\n", "VmRSS:"),
            Some(5120)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process() {
        let s = Sample::read();
        assert!(s.cpu_seconds.is_some_and(|c| c >= 0.0));
        assert!(s.resident_bytes.is_some_and(|r| r > 1024 * 1024));
        assert!(s.open_fds.is_some_and(|n| n >= 3));
        assert!(s.max_fds.is_some_and(|n| n >= s.open_fds.unwrap_or(0)));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        let start = s.start_time_seconds.expect("start time");
        assert!(
            start <= now + 1.0 && start > now - 86400.0 * 365.0,
            "{start} vs {now}"
        );
    }
}
