//! Instruction counts for the benches: the bench binary runs itself again under `valgrind --tool=callgrind`,
//! counting only what one `#[inline(never)]` function of it runs, so the figure is deterministic and leaves out
//! start-up and warm-up.

use std::process::{Command, Stdio};

/// The instructions callgrind counts inside the functions matching `function` (a glob of their names, such as
/// `*measured_calls*`) while this binary runs again with `args` (its child mode).
///
/// # Errors
/// valgrind missing or failing, or no total in its output: a message naming the child's command line.
pub fn instructions(function: &str, args: &[String]) -> Result<u64, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = std::env::temp_dir().join(format!(
        "tollgate-callgrind-{}-{}.out",
        std::process::id(),
        args.join("-")
    ));
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--toggle-collect={function}"))
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&me)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run valgrind ({e}); install it (apt-get install valgrind)"))?;
    if !status.success() {
        return Err(format!(
            "the child failed under valgrind ({status}); run it alone: {} {}",
            me.display(),
            args.join(" ")
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "no instruction total in callgrind's output for {}",
                args.join(" ")
            )
        })
}
