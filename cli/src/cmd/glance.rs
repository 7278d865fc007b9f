//! `flower glance "COMMAND"`: the verdict the coordinator's guard gives a
//! command, and why — for operators tuning policies. Exit 0 when allowed, 1
//! when not.

use std::process::ExitCode;

use clap::Args;
use flower_agent::glance::is_ephemeral;

#[derive(Args)]
pub struct GlanceArgs {
    /// The shell command, quoted as one argument
    pub command: String,
    /// Print the verdict as JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: GlanceArgs) -> anyhow::Result<ExitCode> {
    let v = is_ephemeral(&args.command);
    if args.json {
        println!("{}", serde_json::to_string(&v)?);
    } else if v.allowed {
        println!("allowed: {}", v.reason);
    } else {
        match &v.segment {
            Some(seg) => println!("refused: segment `{seg}`: {}", v.reason),
            None => println!("refused: {}", v.reason),
        }
    }
    Ok(if v.allowed { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
