//! What the policy-file tests over TCP share: a router served on a loopback port, and a store on a private Redis.

use std::net::SocketAddr;

use axum::Router;
use tollgate_redis::RedisStore;
use tollgate_testkit::redis::RedisServer;

/// Serves `app` on a loopback port, on a runtime of its own (dropped with the process).
pub(crate) fn serve_router(app: Router) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    listener.set_nonblocking(true).expect("non-blocking");
    let addr = listener.local_addr().expect("its address");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .expect("serve");
        });
    });
    addr
}

/// A store on the private `redis`.
pub(crate) fn redis_store(redis: &RedisServer) -> RedisStore {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(RedisStore::builder(redis.url()).build())
        .expect("the private Redis")
}
