use axum::extract::MatchedPath;
use http::Request;
use tollgate_tower::{KeyError, KeyExtractor};

/// The method and the matched route template (`GET /users/{id}`), from axum's `MatchedPath`.
///
/// Every URL matching one route shares a key, so `/users/1` and `/users/2` count together. Use it with
/// `Router::layer` or `MethodRouter::layer` (axum sets `MatchedPath` before those run); around the whole router
/// (outside routing) the route is not known yet and the request fails with a configuration error.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteKey;

impl<B> KeyExtractor<Request<B>> for RouteKey {
    fn extract(&self, req: &Request<B>, key: &mut String) -> Result<(), KeyError> {
        let path = req.extensions().get::<MatchedPath>().ok_or_else(|| {
            KeyError::missing("the matched route (MatchedPath)").with_hint(
                "apply the layer with Router::layer or MethodRouter::layer, not around the router",
            )
        })?;
        key.push_str(req.method().as_str());
        key.push(' ');
        key.push_str(path.as_str());
        Ok(())
    }
}
