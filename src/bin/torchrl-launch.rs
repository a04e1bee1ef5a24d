//! `torchrl-launch`: starts N local processes of a command with torchrun's variables (`RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), waits for
//! them, and when one fails stops the others and exits non-zero naming the rank.
//!
//! ```text
//! torchrl-launch --nproc-per-node 2 [--master-port 29500] [--master-addr 127.0.0.1]
//!                [--nnodes 1 --node-rank 0] -- <command> [args...]
//! ```
//!
//! Without `--master-port` a free port is picked on this machine (single-node runs); with
//! several nodes pass the same `--master-addr`/`--master-port` on every node, and `--node-rank`
//! (0 on the master's node). See docs/distributed.md.

use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::time::Duration;

const USAGE: &str = "usage: torchrl-launch --nproc-per-node N [--master-port P] \
[--master-addr ADDR] [--nnodes M --node-rank K] -- <command> [args...]";

struct Args {
    nproc: usize,
    nnodes: usize,
    node_rank: usize,
    master_addr: String,
    master_port: Option<u16>,
    command: Vec<String>,
}

fn parse_args(argv: &[String]) -> Result<Args, String> {
    let mut args = Args {
        nproc: 0,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".to_string(),
        master_port: None,
        command: Vec::new(),
    };
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            args.command = it.cloned().collect();
            break;
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let flag = flag.replace('_', "-");
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_string());
        }
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value\n{USAGE}")),
            }
        };
        let number = |name: &str, v: String| -> Result<usize, String> {
            v.parse::<usize>()
                .map_err(|_| format!("{name} expects a non-negative integer, got {v:?}"))
        };
        match flag.as_str() {
            "--nproc-per-node" => args.nproc = number("--nproc-per-node", value()?)?,
            "--nnodes" => args.nnodes = number("--nnodes", value()?)?,
            "--node-rank" => args.node_rank = number("--node-rank", value()?)?,
            "--master-addr" => args.master_addr = value()?,
            "--master-port" => {
                let v = value()?;
                args.master_port = Some(
                    v.parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| format!("--master-port expects 1..=65535, got {v:?}"))?,
                );
            }
            other => return Err(format!("unknown option {other:?}\n{USAGE}")),
        }
    }
    if args.nproc == 0 {
        return Err(format!("--nproc-per-node N (N >= 1) is required\n{USAGE}"));
    }
    if args.nnodes == 0 || args.node_rank >= args.nnodes {
        return Err(format!(
            "--node-rank ({}) must be below --nnodes ({})",
            args.node_rank, args.nnodes
        ));
    }
    if args.nnodes > 1 && args.master_port.is_none() {
        return Err("with --nnodes > 1, pass the same --master-port on every node".to_string());
    }
    if args.command.is_empty() {
        return Err(format!("no command after `--`\n{USAGE}"));
    }
    Ok(args)
}

/// A port that was free a moment ago (the OS's choice for port 0).
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("could not find a free port: {e}"))
}

/// On Linux, asks the kernel to SIGKILL the child when the launcher dies (killed itself, or
/// stopped by a test harness), so that no rank outlives it.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2), which
    // is async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}

fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return format!("killed by signal {sig}");
        }
    }
    match status.code() {
        Some(c) => format!("exit code {c}"),
        None => "an unknown status".to_string(),
    }
}

fn stop_all(children: &mut [(usize, Child, bool)]) {
    for (_, child, done) in children.iter_mut() {
        if !*done {
            let _ = child.kill();
            let _ = child.wait();
            *done = true;
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let port = match args.master_port {
        Some(p) => p,
        None => free_port()?,
    };
    let world = args.nproc * args.nnodes;
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| "no command".to_string())?;
    let mut children: Vec<(usize, Child, bool)> = Vec::with_capacity(args.nproc);
    for local in 0..args.nproc {
        let rank = args.node_rank * args.nproc + local;
        let mut command = Command::new(program);
        die_with_parent(&mut command);
        let spawned = command
            .args(rest)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc.to_string())
            .env("GROUP_RANK", args.node_rank.to_string())
            .env("MASTER_ADDR", &args.master_addr)
            .env("MASTER_PORT", port.to_string())
            .spawn();
        match spawned {
            Ok(child) => children.push((rank, child, false)),
            Err(e) => {
                stop_all(&mut children);
                return Err(format!("could not start rank {rank} ({program}): {e}"));
            }
        }
    }
    let mut remaining = children.len();
    while remaining > 0 {
        let mut failure = None;
        for (rank, child, done) in children.iter_mut() {
            if *done {
                continue;
            }
            match child.try_wait() {
                Ok(Some(status)) => {
                    *done = true;
                    remaining -= 1;
                    if !status.success() {
                        failure = Some(format!("rank {rank} failed with {}", describe(status)));
                        break;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    failure = Some(format!("could not wait for rank {rank}: {e}"));
                    break;
                }
            }
        }
        if let Some(msg) = failure {
            let others = children.iter().filter(|c| !c.2).count();
            stop_all(&mut children);
            return Err(format!("{msg}; stopped the {others} other running rank(s)"));
        }
        if remaining > 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = parse_args(&argv).and_then(run);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("torchrl-launch: {msg}");
            ExitCode::FAILURE
        }
    }
}
