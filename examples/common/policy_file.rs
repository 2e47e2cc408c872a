//! `--config FILE` in the example servers: the limits come from a policy file (`tollgate::config`), read again on
//! `SIGHUP`. Included with `#[path = "common/policy_file.rs"] mod policy_file;`.
#![allow(dead_code)]

use std::io::Write as _;

use tollgate::Store;
use tollgate::config::Reloader;

/// Reads the policy file again whenever the process gets `SIGHUP`, saying on stdout what changed (`reloaded …`)
/// or on stderr why the file was refused (`file:line:column: …`, the old limits staying in force).
pub(crate) fn reload_on_sighup<St: Store>(reloader: Reloader<St>) -> Result<(), String> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup()).map_err(|e| format!("SIGHUP: {e}"))?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match reloader.reload() {
                    Ok(report) => {
                        let _ = writeln!(std::io::stdout(), "reloaded the policy file: {report}");
                    }
                    Err(err) => {
                        let _ = writeln!(
                            std::io::stdout(),
                            "reload refused, the limits in force stay: {err}"
                        );
                    }
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = reloader;
    Ok(())
}
