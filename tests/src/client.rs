//! A minimal HTTP/1.1 JSON client for the emulator (used by the vector
//! replay, the kubelet simulator and tests). One connection per request, or one kept-alive
//! connection for many ([`KubeClient::keep_alive`], benchmarks).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use serde_json::Value;
use std::time::Duration;

/// A raw answer.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl HttpResponse {
    /// The body as JSON (`Value::Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Errors of the client itself (not HTTP error codes).
#[derive(Debug)]
pub struct ClientError(pub String);

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClientError {}

fn err(e: impl std::fmt::Display) -> ClientError {
    ClientError(e.to_string())
}

/// A client bound to a base URL and a bearer token.
#[derive(Debug, Clone)]
pub struct KubeClient {
    host: String,
    token: String,
    pub user_agent: String,
}

impl KubeClient {
    /// `base_url` is `http://host:port`.
    pub fn new(base_url: &str, token: &str) -> Self {
        Self {
            host: base_url
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string(),
            token: token.to_string(),
            user_agent: "podca-tests/0.1".to_string(),
        }
    }

    /// A new HTTP/1.1 connection to the emulator.
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, ClientError> {
        let stream = tokio::net::TcpStream::connect(&self.host)
            .await
            .map_err(err)?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(err)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn build(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<hyper::Request<Full<Bytes>>, ClientError> {
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.host.as_str())
            .header("user-agent", self.user_agent.as_str())
            .header("accept", "application/json");
        if !self.token.is_empty() {
            b = b.header("authorization", format!("Bearer {}", self.token));
        }
        if let Some(ct) = content_type {
            b = b.header("content-type", ct);
        }
        b.body(Full::new(Bytes::from(body))).map_err(err)
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<hyper::Response<Incoming>, ClientError> {
        let mut sender = self.connect().await?;
        let req = self.build(method, path, content_type, body)?;
        sender.send_request(req).await.map_err(err)
    }

    /// A client that keeps one HTTP/1.1 connection open and sends request after request on it,
    /// as kube-rs's connection pool does, so that a benchmark measures the API and not
    /// connection setup.
    pub fn keep_alive(&self) -> KeepAliveClient {
        KeepAliveClient {
            client: self.clone(),
            sender: None,
        }
    }

    /// Send a request and read the whole answer.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<HttpResponse, ClientError> {
        let resp = self.send(method, path, content_type, body).await?;
        read_response(resp).await
    }

    pub async fn get(&self, path: &str) -> Result<HttpResponse, ClientError> {
        self.request("GET", path, None, Vec::new()).await
    }
    pub async fn post(&self, path: &str, body: &Value) -> Result<HttpResponse, ClientError> {
        self.request(
            "POST",
            path,
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await
    }
    pub async fn put(&self, path: &str, body: &Value) -> Result<HttpResponse, ClientError> {
        self.request(
            "PUT",
            path,
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await
    }
    pub async fn merge_patch(&self, path: &str, body: &Value) -> Result<HttpResponse, ClientError> {
        self.request(
            "PATCH",
            path,
            Some("application/merge-patch+json"),
            body.to_string().into_bytes(),
        )
        .await
    }
    pub async fn delete(&self, path: &str) -> Result<HttpResponse, ClientError> {
        self.request("DELETE", path, None, Vec::new()).await
    }

    /// Open a watch (or any streaming GET); the status code is checked by the caller.
    pub async fn watch(&self, path: &str) -> Result<WatchStream, ClientError> {
        let resp = self.send("GET", path, None, Vec::new()).await?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        Ok(WatchStream {
            status,
            headers,
            body: resp.into_body(),
            buf: Vec::new(),
            ended: false,
        })
    }
}

async fn read_response(resp: hyper::Response<Incoming>) -> Result<HttpResponse, ClientError> {
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let body = resp.into_body().collect().await.map_err(err)?.to_bytes();
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

/// A [`KubeClient`] on one kept-alive connection (see [`KubeClient::keep_alive`]); it
/// reconnects when the server closed the connection.
#[derive(Debug)]
pub struct KeepAliveClient {
    client: KubeClient,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl KeepAliveClient {
    /// Send a request on the kept connection and read the whole answer.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<HttpResponse, ClientError> {
        let req = self.client.build(method, path, content_type, body)?;
        let sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.client.connect().await?,
        };
        let mut sender = sender;
        sender.ready().await.map_err(err)?;
        let resp = sender.send_request(req).await.map_err(err)?;
        let answer = read_response(resp).await?;
        self.sender = Some(sender);
        Ok(answer)
    }

    pub async fn merge_patch(
        &mut self,
        path: &str,
        body: &Value,
    ) -> Result<HttpResponse, ClientError> {
        self.request(
            "PATCH",
            path,
            Some("application/merge-patch+json"),
            body.to_string().into_bytes(),
        )
        .await
    }
}

/// A streaming watch answer, read one JSON line at a time.
#[derive(Debug)]
pub struct WatchStream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    body: Incoming,
    buf: Vec<u8>,
    ended: bool,
}

impl WatchStream {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The next event, `Ok(None)` when the stream ended, `Err` on timeout.
    pub async fn next_event(&mut self, timeout: Duration) -> Result<Option<Value>, ClientError> {
        match self.next_line(timeout).await? {
            Some(line) => serde_json::from_slice(&line).map(Some).map_err(err),
            None => Ok(None),
        }
    }

    /// The next event as the server wrote it (its bytes, without the newline), `Ok(None)` when
    /// the stream ended, `Err` on timeout.
    pub async fn next_line(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, ClientError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                line.pop();
                return Ok(Some(line));
            }
            if self.ended {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                return Ok(Some(std::mem::take(&mut self.buf)));
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .map_err(|_| ClientError("timed out waiting for a watch event".into()))?;
            match frame {
                None => self.ended = true,
                Some(Err(e)) => return Err(err(e)),
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
            }
        }
    }

    /// Events until `pred` holds for one (returned with all before it).
    pub async fn until(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Result<Vec<Value>, ClientError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_event(left).await? {
                Some(ev) => {
                    let done = pred(&ev);
                    out.push(ev);
                    if done {
                        return Ok(out);
                    }
                }
                None => return Err(ClientError("watch ended before the condition held".into())),
            }
        }
    }
}
