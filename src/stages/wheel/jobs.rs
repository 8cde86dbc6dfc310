//! How many compile jobs a wheel build runs (`MAX_JOBS`): `--jobs N`, else
//! the recipe's `build.max_jobs`, where `auto` is the CPUs, fewer when the
//! available memory ([`crate::host::memory`]) holds fewer jobs of
//! `build.mem_per_job_gib` each; at least 1. Not part of the wheel key: it
//! changes how fast the wheel is built, not what is built.

use serde::{Deserialize, Serialize};

use crate::host::memory::Available;
use crate::recipe::Build;

const GIB: f64 = (1u64 << 30) as f64;

/// The number of jobs and why, as `plan` prints it and `build.json` records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Jobs {
    /// `MAX_JOBS`.
    pub jobs: usize,
    /// Where the number comes from, e.g. `auto = min(16 CPUs, 23.4 GiB
    /// available (MemAvailable) / 4 GiB a job (build.mem_per_job_gib,
    /// cuda's default) = 5)`.
    pub why: String,
}

/// What the host offers, measured once ([`Host::measure`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    /// CPUs this process may use.
    pub cpus: usize,
    /// The memory available now (`None`: not known).
    pub memory: Option<Available>,
}

impl Host {
    /// This host now: [`crate::host::toolchain::cpu_count`] and
    /// [`crate::host::memory::available`].
    pub fn measure() -> Host {
        Host {
            cpus: crate::host::toolchain::cpu_count(),
            memory: crate::host::memory::available(),
        }
    }
}

/// The jobs of a build of `build` on `host`; `overridden`: `--jobs N`.
/// Pure: `build.max_jobs` is validated (`auto` or a positive integer), and
/// an unparsable one reads as `auto`.
pub fn decide(build: &Build, overridden: Option<usize>, host: &Host) -> Jobs {
    if let Some(n) = overridden {
        return Jobs {
            jobs: n.max(1),
            why: format!("--jobs {n} (overrides build.max_jobs {})", build.max_jobs),
        };
    }
    if let Ok(n) = build.max_jobs.parse::<usize>() {
        return Jobs {
            jobs: n.max(1),
            why: "build.max_jobs".into(),
        };
    }
    let cpus = host.cpus.max(1);
    let (per_job, from) = build.mem_per_job();
    let Some(mem) = &host.memory else {
        return Jobs {
            jobs: cpus,
            why: format!("auto = {cpus} CPUs (the available memory is not known here)"),
        };
    };
    // `as` saturates: a huge fit is capped by the CPUs below.
    let fit = (mem.bytes as f64 / (per_job * GIB)).floor() as usize;
    let jobs = cpus.min(fit.max(1));
    Jobs {
        jobs,
        why: format!(
            "auto = min({cpus} CPUs, {:.1} GiB available ({}) / {} GiB a job ({from}) = {fit}){}",
            mem.bytes as f64 / GIB,
            mem.from,
            trim(per_job),
            if fit == 0 { ", at least 1" } else { "" },
        ),
    }
}

/// `4` for 4.0, `5.5` for 5.5.
fn trim(v: f64) -> String {
    let s = format!("{v}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(device: &str, per_job: Option<f64>) -> Build {
        Build {
            target_device: device.into(),
            mem_per_job_gib: per_job,
            ..Build::default()
        }
    }

    fn host(cpus: usize, gib: f64) -> Host {
        Host {
            cpus,
            memory: Some(Available {
                bytes: (gib * GIB) as u64,
                from: "MemAvailable".into(),
            }),
        }
    }

    #[test]
    fn cpu_bound_when_memory_holds_more_jobs() {
        let j = decide(&build("cpu", None), None, &host(4, 64.0));
        assert_eq!(j.jobs, 4);
        assert_eq!(
            j.why,
            "auto = min(4 CPUs, 64.0 GiB available (MemAvailable) / 1 GiB a job (build.mem_per_job_gib, cpu's default) = 64)"
        );
    }

    #[test]
    fn memory_bound_with_cudas_default() {
        let j = decide(&build("cuda", None), None, &host(16, 23.4));
        assert_eq!(j.jobs, 5);
        assert_eq!(
            j.why,
            "auto = min(16 CPUs, 23.4 GiB available (MemAvailable) / 4 GiB a job (build.mem_per_job_gib, cuda's default) = 5)"
        );
        // The team's GB10: 20 cores, ~110 GiB available, 20 GiB a job.
        assert_eq!(
            decide(&build("cuda", Some(20.0)), None, &host(20, 110.0)).jobs,
            5
        );
    }

    #[test]
    fn a_cgroup_limit_smaller_than_mem_available_decides() {
        let mem = crate::host::memory::choose(
            Some(100 << 30),
            Some((6 << 30, "/user.slice/build.scope".into())),
        );
        let h = Host {
            cpus: 16,
            memory: mem,
        };
        let j = decide(&build("cuda", Some(2.0)), None, &h);
        assert_eq!(j.jobs, 3);
        assert!(
            j.why
                .contains("cgroup /user.slice/build.scope: memory.max - memory.current"),
            "{}",
            j.why
        );
    }

    #[test]
    fn tiny_memory_gives_one_job() {
        let j = decide(&build("cuda", None), None, &host(16, 0.5));
        assert_eq!(j.jobs, 1);
        assert!(j.why.ends_with("= 0), at least 1"), "{}", j.why);
        let none = Host {
            cpus: 8,
            memory: Some(Available {
                bytes: 0,
                from: "MemAvailable".into(),
            }),
        };
        assert_eq!(decide(&build("cpu", None), None, &none).jobs, 1);
    }

    #[test]
    fn a_number_or_jobs_flag_is_taken_as_given() {
        let mut b = build("cuda", None);
        b.max_jobs = "6".into();
        let j = decide(&b, None, &host(2, 1.0));
        assert_eq!((j.jobs, j.why.as_str()), (6, "build.max_jobs"));
        let j = decide(&b, Some(3), &host(2, 1.0));
        assert_eq!(j.jobs, 3);
        assert_eq!(j.why, "--jobs 3 (overrides build.max_jobs 6)");
        let unknown = Host {
            cpus: 8,
            memory: None,
        };
        let j = decide(&build("cuda", None), None, &unknown);
        assert_eq!(j.jobs, 8);
    }
}
