//! Calls `helloworld.Greeter/SayHello` in a loop and shows what a rate-limited gRPC client sees: the status code,
//! the message, the `google.rpc.RetryInfo` delay (and `ErrorInfo`) from `grpc-status-details-bin`, and the
//! rate-limit metadata.
//!
//! ```text
//! cargo run --example grpc_server -- --limit 3 --period 10s &
//! cargo run --example grpc_client -- --count 5
//! ```

#[path = "common/cli.rs"]
mod cli;

use std::time::Duration;

use tonic::metadata::MetadataMap;
use tonic_types::StatusExt;

/// The code generated from `crates/tollgate-grpc/proto/helloworld.proto` (see `proto/check.sh` there).
#[allow(unreachable_pub)]
mod helloworld {
    include!("../crates/tollgate-grpc/proto/helloworld.rs");
}

use helloworld::HelloRequest;
use helloworld::greeter_client::GreeterClient;

const FIELDS: [&str; 8] = [
    "ratelimit-policy",
    "ratelimit",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-used",
    "x-ratelimit-resource",
    "retry-after",
];

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "grpc_client",
    about = "Calls helloworld.Greeter/SayHello in a loop and shows what a rate-limited gRPC client sees"
)]
struct Config {
    /// The server
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:50051")]
    addr: String,

    /// Calls to make
    #[arg(long, value_name = "N", default_value = "10", value_parser = cli::positive)]
    count: u64,

    /// Pause between calls: 0s, 100ms, 1s
    #[arg(long, value_name = "DUR", default_value = "0s", value_parser = cli::duration_or_zero)]
    interval: Duration,

    /// The name to greet
    #[arg(long, value_name = "NAME", default_value = "tollgate")]
    name: String,

    /// Send KEY as x-api-key metadata (see the server's --api-key-header)
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,

    /// After a rejection, wait the RetryInfo delay before the next call
    #[arg(long)]
    wait: bool,
}

fn print_fields(md: &MetadataMap) {
    for name in FIELDS {
        if let Some(value) = md.get(name).and_then(|v| v.to_str().ok()) {
            println!("    {name}: {value}");
        }
    }
}

#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("grpc_client: {err}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let config: Config = cli::parse();
    let mut client = GreeterClient::connect(config.addr.clone())
        .await
        .map_err(|e| format!("--addr {}: {e}", config.addr))?;
    for i in 1..=config.count {
        let mut request = tonic::Request::new(HelloRequest {
            name: config.name.clone(),
        });
        if let Some(key) = &config.api_key {
            let value = key
                .parse()
                .map_err(|_| format!("--api-key {key:?}: not valid ASCII metadata"))?;
            request.metadata_mut().insert("x-api-key", value);
        }
        let mut pause = config.interval;
        match client.say_hello(request).await {
            Ok(reply) => {
                println!("#{i} OK {:?}", reply.get_ref().message);
                print_fields(reply.metadata());
            }
            Err(status) => {
                println!("#{i} {:?}: {}", status.code(), status.message());
                let retry = status.get_details_retry_info().and_then(|r| r.retry_delay);
                match retry {
                    Some(delay) => println!("    RetryInfo.retry_delay: {delay:?}"),
                    None => println!("    no RetryInfo: do not retry"),
                }
                if let Some(info) = status.get_details_error_info() {
                    let mut meta: Vec<_> = info
                        .metadata
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    meta.sort();
                    println!(
                        "    ErrorInfo: reason {} domain {} {}",
                        info.reason,
                        info.domain,
                        meta.join(" ")
                    );
                }
                print_fields(status.metadata());
                if config.wait {
                    pause = pause.max(retry.unwrap_or_default());
                }
            }
        }
        if i < config.count && !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    Ok(())
}
