//! Helpers the unit tests of the HTTP listeners (admin, OIDC discovery) share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A kept-alive connection to `addr` on which `request` was answered 200: so the server has
/// accepted it, and it holds one of the listener's connection slots until a timeout closes it.
pub async fn answered(addr: SocketAddr, request: &[u8]) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut head = [0u8; 12];
    tcp.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    tcp
}
