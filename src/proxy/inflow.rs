//! A request body forwarded as it arrives. When nothing on the request needs the body before
//! it goes (no synthesis; a marker only when [`InMark`] can place it as the body flows: then
//! the placeholder scan, the usage step and the cache model's copy), [`Inflow`] sends each
//! chunk upstream as it comes, up to the first place one of those steps could edit
//! ([`TopScan`]) or the marker's place is not settled, with the marker's edits spliced in as
//! they are passed, and holds the rest; at the end the caller runs the steps a collected body
//! gets and sends what lies past what already went. Owns the upstream side of the body
//! ([`Piped`]) and the chunk bookkeeping; never decides what a body needs and never plans an
//! edit (that is `super::body_steps`' and `super::inmark`'s).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;

use crate::body::{Body, BoxError};
use crate::budget;
use crate::error::ProxyError;
use crate::json::stream::{TopFacts, TopScan};

use super::exchange::reserve;
use super::inmark::{Edit, InMark};

/// Chunks in flight between the pump and the upstream connection: enough to keep both busy,
/// few enough that a slow upstream holds the client back (the pump waits for room).
const CHANNEL_CHUNKS: usize = 4;

enum Msg {
    Data(Bytes),
    End,
}

/// The upstream request's body: what [`Inflow`] sends. A pump dropped before the end (the
/// client went, a limit was hit, an upstream that answered early stopped reading) ends it with
/// an error, so the upstream connection is closed rather than handed a short body as if whole.
pub(super) struct Piped {
    rx: mpsc::Receiver<Msg>,
    /// Its length, when it goes with the client's `content-length`.
    len: Option<u64>,
    ended: bool,
}

impl HttpBody for Piped {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Msg::Data(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(Some(Msg::End)) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(Some(Err("the request body was cut short".into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        self.len
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// The upstream went away (its connection failed or it stopped reading the body): its own
/// error is what the exchange reports.
#[derive(Debug)]
pub(super) struct Gone;

/// The pump's side: the client's body, what the scan knows, what went and what is held.
pub(super) struct Inflow {
    client: Body,
    tx: mpsc::Sender<Msg>,
    scan: TopScan,
    /// Every chunk received, in order (references, not copies): the steps at the end and the
    /// cache model read the body whole.
    chunks: Vec<Bytes>,
    received: u64,
    /// Bytes of the body as received that went upstream so far, all from its start.
    sent: usize,
    /// Bytes that went upstream so far (the marker's edits made).
    out_sent: usize,
    limit: u64,
    /// Marking as the body flows, when the request's marker can be.
    mark: Option<InMark>,
    /// The marker's edits (offsets of the body as received, sorted), and those not yet passed.
    edits: Vec<Edit>,
    pending: VecDeque<Edit>,
    /// How much longer the edits make the body.
    grown: u64,
}

/// A body read to its end: its chunks as received, what went already, and what the scan saw.
pub(super) struct Received {
    chunks: Vec<Bytes>,
    len: usize,
    /// Bytes of the body as it goes upstream (edits made) that went already.
    pub sent: usize,
    /// What the scan saw, in the offsets of the body as it goes.
    pub facts: TopFacts,
    /// The marking as the body flowed, when there was one.
    pub mark: Option<InMark>,
    /// What the scan saw, in the offsets of the body as received.
    pub received_facts: TopFacts,
    edits: Vec<Edit>,
    /// Edits not passed yet (at or past what went of the body as received).
    pending: usize,
    tx: mpsc::Sender<Msg>,
}

impl Inflow {
    /// The pump for `client` (its first chunk already read: [`Inflow::run`] takes it) and the
    /// body the upstream request carries; `len`: the length to declare, when the body is known
    /// to go unchanged in size.
    pub(super) fn new(client: Body, limit: u64, len: Option<u64>) -> (Self, Piped) {
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let piped = Piped {
            rx,
            len,
            ended: false,
        };
        let inflow = Self {
            client,
            tx,
            scan: TopScan::default(),
            chunks: Vec::new(),
            received: 0,
            sent: 0,
            out_sent: 0,
            limit,
            mark: None,
            edits: Vec::new(),
            pending: VecDeque::new(),
            grown: 0,
        };
        (inflow, piped)
    }

    /// The pump marks the body as it flows with `mark`.
    pub(super) fn with_mark(mut self, mark: InMark) -> Self {
        self.mark = Some(mark);
        self.scan = TopScan::reading_messages();
        self
    }

    /// Reads the client's body to its end (`first` is the chunk already read), sending what
    /// may go as it comes. Errors: the client's (its body failed or passed `limits.max_body`,
    /// the buffered budget ran out) as [`ProxyError`]s; the upstream's as `Ok(Err(Gone))`.
    pub(super) async fn run(
        mut self,
        first: Bytes,
        buffered: &mut budget::Reservation<'_>,
    ) -> Result<Result<Received, Gone>, ProxyError> {
        let mut next = Some(first);
        loop {
            if let Some(data) = next.take() {
                self.take(data, buffered)?;
                if self.flush().await.is_err() {
                    return Ok(Err(Gone));
                }
            }
            let Some(frame) = self.client.frame().await else {
                break;
            };
            let frame = frame.map_err(super::exchange::client_body_error)?;
            next = frame.into_data().ok();
        }
        self.scan.finish();
        if let Some(m) = self.mark.as_mut() {
            m.at_end();
        }
        let received_facts = self.scan.facts().clone();
        Ok(Ok(Received {
            chunks: self.chunks,
            len: self.received as usize,
            sent: self.out_sent,
            facts: shifted(&received_facts, &self.edits),
            received_facts,
            mark: self.mark,
            pending: self.pending.len(),
            edits: self.edits,
            tx: self.tx,
        }))
    }

    fn take(
        &mut self,
        data: Bytes,
        buffered: &mut budget::Reservation<'_>,
    ) -> Result<(), ProxyError> {
        self.received += data.len() as u64;
        if self.received + self.grown > self.limit {
            return Err(ProxyError::BodyTooLarge { limit: self.limit });
        }
        reserve(buffered, self.received)?;
        self.scan.feed(&data);
        self.chunks.push(data);
        if let Some(mark) = self.mark.as_mut() {
            if let Some(edits) = mark.after_chunk(self.scan.facts(), &self.chunks)? {
                for (range, bytes) in &edits {
                    let len = (bytes.len() as u64).saturating_sub(range.len() as u64);
                    self.grown = self.grown.saturating_add(len);
                }
                if self.received + self.grown > self.limit {
                    return Err(ProxyError::BodyTooLarge { limit: self.limit });
                }
                self.pending.extend(edits.iter().cloned());
                self.edits = edits;
            }
        }
        Ok(())
    }

    /// Sends what the scan and the marking let go and has not gone yet, the marker's edits
    /// made as they are passed.
    async fn flush(&mut self) -> Result<(), Gone> {
        let mut safe = self.scan.safe_len();
        if let Some(hold) = self.mark.as_ref().and_then(|m| m.hold(self.scan.facts())) {
            safe = safe.min(hold);
        }
        while self.sent < safe {
            let next = self
                .pending
                .front()
                .filter(|e| e.0.start < safe && e.0.end <= safe);
            let until = next.map_or(safe, |e| e.0.start);
            let edit = next.map(|e| (e.0.end, e.1.clone()));
            send_span(&self.tx, &self.chunks, self.sent..until).await?;
            self.out_sent += until - self.sent;
            self.sent = until;
            let Some((end, bytes)) = edit else {
                break;
            };
            self.out_sent += bytes.len();
            self.tx.send(Msg::Data(bytes)).await.map_err(|_| Gone)?;
            self.sent = end;
            self.pending.pop_front();
        }
        Ok(())
    }
}

/// Sends the bytes `span` of the body received as `chunks`, cut from them without copying.
async fn send_span(
    tx: &mpsc::Sender<Msg>,
    chunks: &[Bytes],
    span: std::ops::Range<usize>,
) -> Result<(), Gone> {
    let mut start = 0;
    for chunk in chunks {
        let end = start + chunk.len();
        if end > span.start && start < span.end {
            let from = span.start.max(start) - start;
            let to = span.end.min(end) - start;
            tx.send(Msg::Data(chunk.slice(from..to)))
                .await
                .map_err(|_| Gone)?;
        }
        start = end;
        if start >= span.end {
            break;
        }
    }
    Ok(())
}

/// `facts` of a body as received, moved onto the body `edits` make of it (edits lie inside
/// `messages`: never across a position the facts name).
pub(super) fn shifted(facts: &TopFacts, edits: &[Edit]) -> TopFacts {
    if edits.is_empty() {
        return facts.clone();
    }
    let at = |pos: usize| {
        edits
            .iter()
            .filter(|e| e.0.end <= pos)
            .fold(pos, |p, e| (p + e.1.len()).saturating_sub(e.0.len()))
    };
    let mut out = facts.clone();
    out.stream = facts
        .stream
        .as_ref()
        .map(|(r, t)| (at(r.start)..at(r.end), *t));
    out.options = facts.options.as_ref().map(|r| at(r.start)..at(r.end));
    out.close = facts.close.map(at);
    out.placeholder = facts.placeholder.map(at);
    // What the marking read is in the offsets it was read in; nothing after it reads them.
    out.messages = None;
    out
}

impl Received {
    /// The body as received, in one buffer.
    pub(super) fn whole(&self) -> Bytes {
        join(&self.chunks, self.len)
    }

    /// The body as it goes upstream (the marker's edits made), in one buffer.
    pub(super) fn output(&self) -> Bytes {
        edited(self.whole(), &self.edits)
    }

    /// The body's length as received.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether the body goes as it came (no marker's edits).
    pub(super) fn unedited(&self) -> bool {
        self.edits.is_empty()
    }

    /// Sends the end of the body (what was held back, the edits not passed yet made) and ends
    /// it.
    pub(super) async fn send_held(&self) -> Result<(), Gone> {
        if self.pending > 0 {
            return self.send_rest_of(&self.output()).await;
        }
        let sent = self.received_sent();
        let mut start = 0;
        for chunk in &self.chunks {
            let end = start + chunk.len();
            if end > sent {
                let from = sent.max(start) - start;
                self.send(chunk.slice(from..)).await?;
            }
            start = end;
        }
        self.tx.send(Msg::End).await.map_err(|_| Gone)
    }

    /// What went of the body as received (every edit before it was passed).
    fn received_sent(&self) -> usize {
        let grown: usize = self.edits.iter().map(|e| e.1.len()).sum();
        let shrunk: usize = self.edits.iter().map(|e| e.0.len()).sum();
        (self.sent + shrunk).saturating_sub(grown)
    }

    /// Sends the end of `body` (the steps' rewrite of the whole body, which leaves the part
    /// already sent as it was) and ends it.
    async fn send_rest_of(&self, body: &Bytes) -> Result<(), Gone> {
        if body.len() > self.sent {
            self.send(body.slice(self.sent..)).await?;
        }
        self.tx.send(Msg::End).await.map_err(|_| Gone)
    }

    /// Sends the end of the body once the steps at its end ran on `base` (the body as it goes,
    /// edits made): `edited`, their new body, from what already went, or else what was held.
    /// The steps edit only where the scan held back: a new body that changes bytes already sent
    /// is a bug, and the upstream must not get a body spliced from two versions. An upstream
    /// that stopped reading answers for itself.
    pub(super) async fn send_edited(
        &self,
        base: &Bytes,
        edited: Option<&Bytes>,
    ) -> Result<(), ProxyError> {
        let Some(bytes) = edited else {
            let _ = self.send_held().await;
            return Ok(());
        };
        if bytes.get(..self.sent) != base.get(..self.sent) {
            return Err(ProxyError::Internal(
                "a streamed body's steps changed bytes already sent".into(),
            ));
        }
        let _ = self.send_rest_of(bytes).await;
        Ok(())
    }

    async fn send(&self, data: Bytes) -> Result<(), Gone> {
        self.tx.send(Msg::Data(data)).await.map_err(|_| Gone)
    }
}

/// `body` with `edits` (sorted, not overlapping) made; itself when there are none.
pub(super) fn edited(body: Bytes, edits: &[Edit]) -> Bytes {
    if edits.is_empty() {
        return body;
    }
    let extra: usize = edits.iter().map(|e| e.1.len()).sum();
    let mut out = BytesMut::with_capacity(body.len() + extra);
    let mut at = 0;
    for (range, bytes) in edits {
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(bytes);
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    out.freeze()
}

/// The chunks as one buffer; one chunk is kept as it is.
fn join(chunks: &[Bytes], len: usize) -> Bytes {
    match chunks {
        [] => Bytes::new(),
        [one] => one.clone(),
        many => {
            let mut buf = BytesMut::with_capacity(len);
            for c in many {
                buf.extend_from_slice(c);
            }
            buf.freeze()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a piped body to its end: its chunks, or the error it ended with.
    async fn drain(mut piped: Piped) -> Result<Vec<Bytes>, BoxError> {
        let mut out = Vec::new();
        while let Some(frame) = piped.frame().await {
            if let Ok(data) = frame?.into_data() {
                out.push(data);
            }
        }
        Ok(out)
    }

    #[tokio::test]
    async fn a_pump_dropped_before_the_end_cuts_the_body_with_an_error() {
        let empty = http_body_util::Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed();
        let (inflow, piped) = Inflow::new(empty, 1 << 20, Some(3));
        inflow
            .tx
            .send(Msg::Data(Bytes::from_static(b"abc")))
            .await
            .ok();
        drop(inflow);
        assert!(
            drain(piped).await.is_err(),
            "a short body must not end cleanly"
        );
    }

    #[tokio::test]
    async fn what_goes_is_the_safe_part_then_the_rest_of_the_final_body() {
        let body = br#"{"messages":[{"role":"user","content":"hello"}],"stream":true}"#;
        let chunks: Vec<Bytes> = body.chunks(7).map(Bytes::copy_from_slice).collect();
        let (first, rest) = (chunks[0].clone(), chunks[1..].to_vec());
        let frames = rest.into_iter().map(|b| Ok::<_, BoxError>(Frame::data(b)));
        let client = http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed();
        let (inflow, piped) = Inflow::new(client, 1 << 20, None);
        let reader = tokio::spawn(drain(piped));
        let budget = budget::BodyBudget::new(1 << 30);
        let mut held = budget.reservation();
        let got = inflow.run(first, &mut held).await.expect("no client error");
        let got = got.expect("the reader is there");
        assert_eq!(&got.whole()[..], &body[..]);
        // Everything before the closing brace went as it came.
        assert_eq!(got.sent, body.len() - 1);
        let edited = crate::proxy::usage::add_include_usage(&got.whole()).expect("an edit");
        got.send_rest_of(&Bytes::from(edited.clone())).await.ok();
        let out: Vec<u8> = reader.await.expect("joins").expect("ends cleanly").concat();
        assert_eq!(out, edited);
    }
}
