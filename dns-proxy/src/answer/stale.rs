//! Serve-stale (RFC 8767) on the answer path: whether the upstream counts as down, the
//! stale answer or failure for a query, the client response timer, and refreshing the cache
//! from a forward that outlived it.

use super::*;

impl AnswerPath {
    /// Every upstream failed within the stale TTL (and serve-stale is on).
    pub(super) fn upstream_down(&self) -> bool {
        let Some(policy) = self.cache.as_ref().and_then(Cache::stale_policy) else {
            return false;
        };
        self.upstream_failed_at
            .lock()
            .ok()
            .and_then(|t| *t)
            .is_some_and(|t| t.elapsed() < policy.stale_ttl)
    }

    /// Records how the last forward went: a failure (every upstream failed, or answered
    /// SERVFAIL/REFUSED) starts the stale window.
    pub(super) fn upstream_result(&self, failed: bool) {
        if let Ok(mut t) = self.upstream_failed_at.lock() {
            *t = failed.then(std::time::Instant::now);
        }
    }

    /// The stale answer kept for `key` (RFC 8767), else `None`.
    pub(super) fn stale_answer(
        &self,
        key: &Key,
        req: &Message,
        transport: Transport,
        from: &Cell<Source>,
    ) -> Option<Vec<u8>> {
        let msg = self.cache.as_ref()?.stale(key, std::time::Instant::now())?;
        self.metrics.stale_answers.inc();
        from.set(Source::Stale);
        encode(&upstream_to_client(msg, req), req, transport)
    }

    /// Every upstream failed for the wire query `w`: its stale answer, if there is one.
    pub(super) fn wire_stale(&self, w: &WireQuery, from: &Cell<Source>) -> Option<Vec<u8>> {
        self.upstream_result(true);
        let key = w.key.as_ref()?;
        let req = Message::from_vec(&w.req).ok()?;
        self.stale_answer(key, &req, Transport::Udp, from)
    }

    /// Every upstream failed for the wire query `w`: its stale answer, else SERVFAIL.
    pub(super) fn wire_failure(&self, w: &WireQuery, from: &Cell<Source>) -> Vec<u8> {
        self.wire_stale(w, from)
            .unwrap_or_else(|| rewrite::error_answer(&w.req, &w.q, 2))
    }

    /// [`AnswerPath::complete`], under the client response timer when a stale answer is kept
    /// for `req` (`stale`).
    pub(super) async fn complete_or_stale(
        self: &Arc<Self>,
        req: Message,
        stale: bool,
        transport: Transport,
        permit: OwnedSemaphorePermit,
        client: SocketAddr,
        started: tokio::time::Instant,
    ) -> Option<Vec<u8>> {
        if !stale {
            let _permit = permit;
            return self.complete(&req, transport, client, started).await;
        }
        let (tx, rx) = oneshot::channel();
        let path = self.clone();
        let forwarded = req.clone();
        let forward = async move {
            let _permit = permit;
            let result = path.upstream_message(&forwarded, transport).await;
            if tx.is_closed() {
                path.refresh_message(&forwarded, &result);
            } else {
                let _ =
                    tx.send(path.message_result(&forwarded, transport, result, client, started));
            }
        };
        self.within_client_timer(forward, rx, || {
            let from = Cell::new(Source::Local);
            let answer = self.stale_answer(&Key::of(&req)?, &req, transport, &from)?;
            if self.access_log {
                let query = req.to_vec().unwrap_or_default();
                self.log(&query, &answer, client, from.get(), started);
            }
            Some(answer)
        })
        .await
    }

    /// [`AnswerPath::complete_wire`] under the client response timer (a stale answer is kept
    /// for `w`).
    pub(super) async fn wire_within_client_timer(
        self: &Arc<Self>,
        w: WireQuery,
        permit: OwnedSemaphorePermit,
        client: SocketAddr,
        started: tokio::time::Instant,
    ) -> Option<Vec<u8>> {
        let (tx, rx) = oneshot::channel();
        let path = self.clone();
        let (key, query) = (w.key.clone(), w.req.clone());
        let forward = async move {
            let _permit = permit;
            let result = path.upstream_wire(&w).await;
            if tx.is_closed() {
                path.refresh_wire(w.key.as_ref(), &result);
            } else {
                let _ = tx.send(path.wire_result(&w, result, client, started));
            }
        };
        self.within_client_timer(forward, rx, || {
            let from = Cell::new(Source::Local);
            let req = Message::from_vec(&query).ok()?;
            let answer = self.stale_answer(key.as_ref()?, &req, Transport::Udp, &from)?;
            self.log(&query, &answer, client, from.get(), started);
            Some(answer)
        })
        .await
    }

    /// RFC 8767's client response timer, for a query whose stale answer is kept: `forward`
    /// runs in a task of its own (ended by the proxy's stop) and sends the client's answer on
    /// `answer`'s sender, or only refreshes the cache when the client already has the stale
    /// one (the sender closed). The client waits for it at most the timer, then gets what
    /// `stale` gives (or, the stale answer gone meanwhile, waits on).
    pub(super) async fn within_client_timer(
        &self,
        forward: impl Future<Output = ()> + Send + 'static,
        mut answer: oneshot::Receiver<Option<Vec<u8>>>,
        stale: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Option<Vec<u8>> {
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = forward => {}
            }
        });
        let timer = self
            .cache
            .as_ref()
            .and_then(Cache::stale_policy)
            .map(|p| p.client_timer)
            .unwrap_or_default();
        match tokio::time::timeout(timer, &mut answer).await {
            Ok(a) => a.ok().flatten(),
            Err(_) => match stale() {
                Some(b) => Some(b),
                None => answer.await.ok().flatten(),
            },
        }
    }

    /// What a wire forward whose client was already answered leaves: the cache refreshed with
    /// the upstream's answer, or the upstream marked down when it failed.
    pub(super) fn refresh_wire(&self, key: Option<&Key>, result: &Result<Vec<u8>, ForwardError>) {
        match result {
            Ok(answer) if !failed_upstream(answer) => {
                self.upstream_result(false);
                if let (Some(cache), Some(key)) = (&self.cache, key)
                    && let Ok(m) = Message::from_vec(answer)
                {
                    cache.put(key.clone(), &m, std::time::Instant::now());
                }
            }
            _ => self.upstream_result(true),
        }
    }

    /// [`AnswerPath::refresh_wire`] for a parsed forward of `req`.
    pub(super) fn refresh_message(&self, req: &Message, result: &Result<Message, ForwardError>) {
        match result {
            Ok(resp)
                if !matches!(
                    resp.metadata.response_code,
                    ResponseCode::ServFail | ResponseCode::Refused
                ) =>
            {
                self.upstream_result(false);
                if let (Some(cache), Some(key)) = (&self.cache, Key::of(req)) {
                    cache.put(key, resp, std::time::Instant::now());
                }
            }
            _ => self.upstream_result(true),
        }
    }
}
