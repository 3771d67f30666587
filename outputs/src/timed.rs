//! Socket I/O that gives up when it makes no progress for a timeout: a stalled receiver must
//! fail the batch (to be retried) rather than hold its output forever. Shared by the syslog
//! output and its RELP transport.

use std::{future::Future, io, time::Duration};

use tokio::{io::AsyncWriteExt, net::TcpStream};

/// Writes `bytes`, failing when a write makes no progress for `timeout` (a stalled receiver).
pub(crate) async fn write_all(stream: &mut TcpStream, mut bytes: &[u8], timeout: Duration) -> io::Result<()> {
    while !bytes.is_empty() {
        let written = within(timeout, "write", stream.write(bytes)).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[written..];
    }
    Ok(())
}

/// `work`, or a `TimedOut` error naming `what` when it has not finished within `timeout`.
pub(crate) async fn within<T>(
    timeout: Duration,
    what: &str,
    work: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, format!("{what}: no progress in {timeout:?}"))),
    }
}
