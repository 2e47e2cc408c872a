use axum::extract::MatchedPath;
use http::{Method, Request};
use tollgate_tower::{KeyError, KeyExtractor};

/// The key of every request that matched no route.
const UNMATCHED: &str = "<unmatched>";

/// The method and the matched route template (`GET /users/{id}`), from axum's `MatchedPath`.
///
/// Every URL matching one route shares a key, so `/users/1` and `/users/2` count together. Use it with
/// `Router::layer`, `Router::route_layer` or `MethodRouter::layer`: axum sets `MatchedPath` before those run.
///
/// Requests that match no route (under `Router::layer`, axum's fallback: the 404s of typos and scanners) share
/// one key, `<unmatched>`, with no method: they are limited too, and no choice of path or method gives a fresh
/// bucket. For the same reason a method outside HTTP's standard nine (which a route served by `any` accepts)
/// is keyed as `OTHER`, and `HEAD` as `GET`: axum answers it with the `GET` handler, so it costs what a `GET`
/// costs, and a client alternating the two would otherwise double its quota. Around the whole router (outside routing) no request has matched a route yet, so every
/// request would be `<unmatched>`: apply the layer inside the router.
///
/// ```
/// use axum::{Router, routing::get};
/// use tollgate_core::{MemoryStore, Policy, Quota};
/// use tollgate_http::HttpLimitLayer;
/// use tollgate_http::key::{ClientIp, RouteKey};
/// use tollgate_tower::RateLimitLayer;
/// # use std::sync::Arc;
///
/// let per_route = RateLimitLayer::new(
///     "per-client-route",
///     Policy::token_bucket(Quota::per_second(5)?),
///     Arc::new(MemoryStore::new()),
///     (ClientIp::new(), RouteKey),
/// );
/// let app: Router = Router::new()
///     .route("/users/{id}", get(|| async { "user" }))
///     .layer(HttpLimitLayer::new(per_route));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteKey;

impl<B> KeyExtractor<Request<B>> for RouteKey {
    fn extract(&self, req: &Request<B>, key: &mut String) -> Result<(), KeyError> {
        let Some(path) = req.extensions().get::<MatchedPath>() else {
            key.push_str(UNMATCHED);
            return Ok(());
        };
        key.push_str(method_key(req.method()));
        key.push(' ');
        key.push_str(path.as_str());
        Ok(())
    }
}

/// A standard method by its name (`HEAD` as `GET`), any other as `OTHER`: a client cannot mint keys by inventing
/// methods.
fn method_key(method: &Method) -> &str {
    match *method {
        Method::HEAD => Method::GET.as_str(),
        Method::GET
        | Method::POST
        | Method::PUT
        | Method::DELETE
        | Method::PATCH
        | Method::OPTIONS
        | Method::CONNECT
        | Method::TRACE => method.as_str(),
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(method: &str, matched: Option<&str>) -> String {
        let mut req = Request::builder()
            .method(method)
            .uri("/x")
            .body(())
            .unwrap();
        if let Some(path) = matched {
            req.extensions_mut().insert(matched_path(path));
        }
        let mut key = String::new();
        RouteKey.extract(&req, &mut key).unwrap();
        key
    }

    /// A `MatchedPath`, as axum's router sets it (it has no public constructor): extracted from a routed request.
    fn matched_path(route: &str) -> MatchedPath {
        use axum::extract::FromRequestParts;
        use axum::routing::get;
        use tower::ServiceExt;

        let (tx, rx) = std::sync::mpsc::channel();
        let app = axum::Router::new().route(
            route,
            get(move |req: axum::extract::Request| {
                let (mut parts, _) = req.into_parts();
                let tx = tx.clone();
                async move {
                    let path = MatchedPath::from_request_parts(&mut parts, &())
                        .await
                        .unwrap();
                    tx.send(path).unwrap();
                }
            }),
        );
        let uri = route.replace("{id}", "7");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime
            .block_on(app.oneshot(Request::get(uri).body(axum::body::Body::empty()).unwrap()))
            .unwrap();
        rx.recv().unwrap()
    }

    #[test]
    fn routes_by_method_and_template_and_the_rest_as_one() {
        assert_eq!(key("GET", Some("/users/{id}")), "GET /users/{id}");
        assert_eq!(key("DELETE", Some("/users/{id}")), "DELETE /users/{id}");
        assert_eq!(key("HEAD", Some("/users/{id}")), "GET /users/{id}");
        assert_eq!(key("BREW", Some("/users/{id}")), "OTHER /users/{id}");
        assert_eq!(key("get", Some("/users/{id}")), "OTHER /users/{id}");
        assert_eq!(key("GET", None), "<unmatched>");
        assert_eq!(key("BREW", None), "<unmatched>");
    }
}
