//! The monitoring listener (`--metrics-listen`, `docs/operating-the-relay.md#health-and-readiness`):
//! plain HTTP/1.1 on a port of its own, apart from the clients', answering `GET /healthz` (the
//! process runs), `GET /readyz` (the relay serves clients) and `GET /metrics` (Prometheus text).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::prometheus_text::CONTENT_TYPE as PROMETHEUS_TEXT;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::metrics::Sampled;
use crate::{stopping, Ctx};

/// Probes and scrapers served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;
/// A request's head must arrive within this, so an idle socket cannot hold a slot forever.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves until `stop`, which the relay sends only once its own tasks have ended, so `/readyz`
/// answers 503 for as long as the relay is stopping.
pub(crate) async fn serve(listener: TcpListener, ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = stopping(&mut stop) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept(), if connections.len() < MAX_CONNECTIONS => match accepted {
                Ok((tcp, _)) => {
                    let ctx = Arc::clone(&ctx);
                    let service = service_fn(move |request| answer(request, Arc::clone(&ctx)));
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(tcp), service);
                    connections.spawn(async move {
                        // A client that goes away mid-request is no concern of the relay's.
                        let _ = connection.await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "monitoring accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    connections.shutdown().await;
}

async fn answer(
    request: Request<Incoming>,
    ctx: Arc<Ctx>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(response);
    }
    let response = match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if *ctx.shutdown.borrow() => text(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
        "/readyz" if !ctx.store.is_open() => {
            text(StatusCode::SERVICE_UNAVAILABLE, "store closed\n")
        }
        "/readyz" => text(StatusCode::OK, "ready\n"),
        "/metrics" => {
            let mut response =
                Response::new(Full::new(Bytes::from(ctx.metrics.encode(sample(&ctx)))));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_TEXT));
            response
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    };
    Ok(response)
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn sample(ctx: &Ctx) -> Sampled {
    Sampled {
        authenticated: ctx.router.connections() as u64,
        accounts: ctx.store.accounts(),
        journal_frames: ctx.store.stored_frames(),
        journal_bytes: ctx.store.stored_bytes(),
        watches: ctx.router.watches() as u64,
    }
}
