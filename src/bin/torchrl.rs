//! The `torchrl` command line: `sft`, `reward`, `ppo`, `grpo`, `dpo`, `ilql`, `generate` and
//! `eval` from a model folder, a JSONL file and a TOML config (`torchrl --help`; the library's
//! `torchrl::cli` module documents every subcommand).

use std::process::ExitCode;

fn main() -> ExitCode {
    match torchrl::cli::main_with_args(std::env::args_os()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("torchrl: {e}");
            ExitCode::FAILURE
        }
    }
}
