//! One worker's way to the upstream ([`Transport`]): kvbust's own plain HTTP/1.1 connections
//! (the client connection's own, or the worker's pool for an HTTP/2 client's streams) and the
//! pooled client for TLS and HTTP/2 upstreams, behind one [`Transport::send`], with the
//! upstream slots a request holds. Owns which connection a request takes; never sets a timeout
//! (the pipeline's) and never reads or rewrites a body.

use std::sync::Arc;

use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use tokio::sync::Semaphore;

use super::client::{self, Upstream, UpstreamClient};
use super::pool::{self, Affinity, H1Pool, Keep, SourceSlots, UpstreamBody};
use crate::body::Body;
use crate::config::UpstreamConfig;
use crate::error::ProxyError;

/// The upstream connections of one worker.
pub struct Transport {
    upstream: Upstream,
    /// TLS or HTTP/2 upstreams (and `upstream.http2 = "always"`).
    client: UpstreamClient,
    /// This worker's idle HTTP/1.1 connections, for HTTP/2 clients' streams (plain http).
    pool: Arc<H1Pool>,
    /// Every worker's source addresses' upstream slots (one table for all workers).
    sources: Arc<SourceSlots>,
    /// Plain HTTP/1.1 upstream: requests go on kvbust's own connections.
    direct: bool,
}

/// The limits a request's upstream connection counts against, held until its response ends.
#[derive(Default, Clone, Copy)]
pub struct Bounds<'a> {
    /// An HTTP/2 client stream's: its connection's slots (`upstream.max_connections_per_client`).
    pub streams: Option<&'a Arc<Semaphore>>,
    /// Its source address's (`upstream.max_connections_per_source`; `None`: no bound).
    pub source: Option<&'a Arc<Semaphore>>,
}

impl Transport {
    /// `client`: this worker's pooled client; `max_upstream`: its HTTP/1.1 pool's bound.
    pub fn new(
        cfg: &UpstreamConfig,
        upstream: Upstream,
        client: UpstreamClient,
        max_upstream: usize,
        sources: Arc<SourceSlots>,
    ) -> Self {
        Transport {
            direct: upstream.is_direct(cfg.http2),
            pool: H1Pool::new(cfg, max_upstream),
            upstream,
            client,
            sources,
        }
    }

    /// The semaphore of `ip`'s upstream slots (`upstream.max_connections_per_source`).
    pub fn source_slots(&self, ip: std::net::IpAddr) -> Option<Arc<Semaphore>> {
        self.sources.of(ip)
    }

    /// A request's target at the upstream: origin form on kvbust's own connections, absolute
    /// for the pooled client.
    pub fn target(&self, pq: Option<&PathAndQuery>) -> Result<Uri, ProxyError> {
        match self.direct {
            true => self.upstream.origin_form(pq),
            false => self.upstream.join(pq),
        }
    }

    /// Sends `req` once `bounds` grant a slot (waiting at most `upstream.connect_timeout`):
    /// on the client connection's own upstream connection (`affinity`, HTTP/1.1 clients), on
    /// one of the worker's pool (HTTP/2 clients' streams), or through the pooled client.
    pub async fn send(
        &self,
        req: Request<Body>,
        affinity: Option<&Affinity>,
        bounds: Bounds<'_>,
        cfg: &UpstreamConfig,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        // An HTTP/2 client's stream holds one of its connection's upstream slots from here to
        // the end of its response: its streams cannot fan out to more upstream connections than
        // `upstream.max_connections_per_client`, however many it opens. Every request holds one
        // of its source address's, so one address's connections together hold at most
        // `upstream.max_connections_per_source`.
        let wait = cfg.connect_timeout;
        let slot = pool::Slots {
            client: pool::acquire_if(bounds.streams, wait, "upstream.max_connections_per_client")
                .await?,
            source: pool::acquire_if(bounds.source, wait, "upstream.max_connections_per_source")
                .await?,
        };
        if !self.direct {
            return self
                .client
                .request(req)
                .await
                .map(|resp| resp.map(|b| UpstreamBody::new(b).holding(slot)))
                .map_err(|e| client::classify(e, &self.upstream, cfg.connect_timeout));
        }
        let keep = match affinity {
            Some(a) => Keep::Own(a),
            None => Keep::Pool(&self.pool),
        };
        pool::send(keep, &self.pool, slot, &self.upstream, cfg, req).await
    }
}
