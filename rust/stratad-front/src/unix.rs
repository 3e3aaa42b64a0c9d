//! Unix socket clients, served by the same HTTP/2 server as TCP ones.
//!
//! grpc-core (grpcio >= 1.57) and grpc-java send a unix socket's path as the
//! `:authority` of every request (`/run/stratad.sock`, or `%2Frun%2F...`),
//! which h2 refuses as a malformed request before any call exists
//! (hyperium/h2#487, open; grpc/grpc#38142). So what a unix client sends
//! reaches h2 through [`relay`], which re-encodes each header block with such
//! an authority replaced by `localhost` and passes every other frame on byte
//! for byte. What h2 sends goes straight to the socket. The relay keeps no
//! frame in memory but one header block (at most [`MAX_BLOCK`] bytes), and
//! anything it does not understand goes to h2 as it came, so h2 still judges
//! every protocol error (h2spec, tests/edge).
//!
//! Re-encoding needs the client's HPACK state, so the relay decodes every
//! header block (loona-hpack, the decoder of a server that passes h2spec) and
//! encodes it again as literals without indexing: h2's dynamic table then
//! stays empty, and a block the relay could not decode, passed on as it
//! came, fails in h2 as it would have without the relay.

use std::sync::Arc;
use std::time::Duration;

use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::call::Peer;
use crate::connection::{
    goaway_not_http2, serve_connection, HANDSHAKE_TIMEOUT, HEADER_LIST_HARD_LIMIT, PREFACE,
};
use crate::shared::OpenConnection;

const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame h2 takes (SETTINGS_MAX_FRAME_SIZE, never raised here):
/// a larger header frame is passed on for h2 to refuse.
const MAX_FRAME: usize = 16_384;
/// The most bytes of one header block (its frames as sent) the relay holds;
/// a client that sends more is cut off (h2 refuses such lists anyway).
const MAX_BLOCK: usize = HEADER_LIST_HARD_LIMIT as usize;
/// Decoded headers beyond this end the connection: an HPACK bomb (a few
/// bytes that index a 4 KiB table entry thousands of times).
const MAX_DECODED: usize = 2 * HEADER_LIST_HARD_LIMIT as usize;
/// HPACK's dynamic table size (h2 announces no other).
const TABLE_SIZE: usize = 4096;
/// Bytes in the pipe from the relay to h2.
const PIPE_BYTES: usize = 64 << 10;
/// What an invalid `:authority` becomes (what grpc-go sends on unix sockets).
const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// Serve a unix socket client: its preface checked (a client that sends
/// something else gets a GOAWAY saying so), then HTTP/2 through [`relay`].
pub(crate) async fn serve_unix(
    io: UnixStream,
    address: String,
    open: OpenConnection,
    stopped: watch::Receiver<bool>,
) {
    let (mut from_client, mut to_client) = io.into_split();
    let mut preface = [0u8; PREFACE.len()];
    let read = tokio::time::timeout(HANDSHAKE_TIMEOUT, from_client.read_exact(&mut preface)).await;
    match read {
        Ok(Ok(_)) if preface == *PREFACE => {}
        Ok(Ok(_)) => {
            let refused = to_client.write_all(&goaway_not_http2()).await;
            if refused.is_ok() {
                drain(&mut from_client).await;
            }
            return;
        }
        _ => return,
    }
    let (h2_reads, mut relay_writes) = tokio::io::simplex(PIPE_BYTES);
    if relay_writes.write_all(PREFACE).await.is_err() {
        return;
    }
    let relay = tokio::spawn(async move {
        let _ = relay(&mut from_client, &mut relay_writes).await;
        // The pipe's end: h2 reads EOF and closes the connection (dropping
        // this half alone would not tell it: its read half shares the pipe).
        let _ = relay_writes.shutdown().await;
    });
    let peer = Arc::new(Peer {
        address,
        certificate: None,
    });
    serve_connection(tokio::io::join(h2_reads, to_client), peer, open, stopped).await;
    relay.abort();
}

/// Read what a refused client still sends (for a second at most), so that it
/// gets the GOAWAY rather than a reset.
async fn drain<R: AsyncRead + Unpin>(from_client: &mut R) {
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while matches!(from_client.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Copy HTTP/2 frames (after the preface) from `client` to `h2`, each header
/// block re-encoded (module doc); returns when either side is done.
pub(crate) async fn relay<R, W>(client: &mut R, h2: &mut W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut decoder = Decoder::new();
    decoder.set_max_allowed_table_size(TABLE_SIZE);
    let mut block: Option<Block> = None;
    loop {
        let mut head = [0u8; FRAME_HEADER];
        client.read_exact(&mut head).await?;
        let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags, stream) = (head[3], head[4], stream_id(&head));
        let continues = kind == CONTINUATION && block.as_ref().is_some_and(|b| b.stream == stream);
        if (kind != HEADERS && !continues) || length > MAX_FRAME || block.is_some() && !continues {
            // Not part of a header block the relay can take: h2 judges it as sent.
            if let Some(open) = block.take() {
                h2.write_all(&open.raw).await?;
            }
            h2.write_all(&head).await?;
            let copied = tokio::io::copy(&mut (&mut *client).take(length as u64), h2).await?;
            if copied < length as u64 {
                return Ok(());
            }
            if kind == HEADERS || kind == CONTINUATION {
                // HPACK state is now h2's to judge alone: pass the rest as it comes.
                tokio::io::copy(client, h2).await?;
                return Ok(());
            }
            continue;
        }
        let mut payload = vec![0u8; length];
        client.read_exact(&mut payload).await?;
        let open = block.get_or_insert_with(|| Block::new(stream));
        open.add(&head, &payload, kind == HEADERS);
        if open.raw.len() > MAX_BLOCK {
            return Ok(());
        }
        if flags & END_HEADERS == 0 {
            continue;
        }
        let done = block.take().unwrap_or_else(|| Block::new(stream));
        match done.reencode(&mut decoder) {
            Reencoded::Frames(frames) => h2.write_all(&frames).await?,
            Reencoded::TooLarge => return Ok(()),
            Reencoded::Undecodable => {
                h2.write_all(&done.raw).await?;
                tokio::io::copy(client, h2).await?;
                return Ok(());
            }
        }
    }
}

fn stream_id(head: &[u8; FRAME_HEADER]) -> u32 {
    u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff
}

/// One header block being collected: a HEADERS frame and its CONTINUATIONs.
struct Block {
    stream: u32,
    /// The frames as the client sent them.
    raw: Vec<u8>,
    /// The header block fragments, without padding and priority.
    fragment: Vec<u8>,
    /// END_STREAM of the HEADERS frame, and its priority fields if any.
    end_stream: bool,
    priority: Option<[u8; 5]>,
    /// The HEADERS frame's padding or priority did not fit in it.
    malformed: bool,
}

enum Reencoded {
    Frames(Vec<u8>),
    /// Decoded, it is larger than any header list h2 takes.
    TooLarge,
    /// Not valid HPACK (or not a well-formed frame): h2 must see it as sent.
    Undecodable,
}

impl Block {
    fn new(stream: u32) -> Block {
        Block {
            stream,
            raw: Vec::new(),
            fragment: Vec::new(),
            end_stream: false,
            priority: None,
            malformed: false,
        }
    }

    fn add(&mut self, head: &[u8; FRAME_HEADER], payload: &[u8], first: bool) {
        self.raw.extend_from_slice(head);
        self.raw.extend_from_slice(payload);
        if !first {
            self.fragment.extend_from_slice(payload);
            return;
        }
        let flags = head[4];
        self.end_stream = flags & END_STREAM != 0;
        let mut body = payload;
        let mut padding = 0;
        if flags & PADDED != 0 {
            let Some((&pad, rest)) = body.split_first() else {
                self.malformed = true;
                return;
            };
            padding = usize::from(pad);
            body = rest;
        }
        if flags & PRIORITY != 0 {
            let Some(fields) = body.get(..5) else {
                self.malformed = true;
                return;
            };
            self.priority = fields.try_into().ok();
            body = &body[5..];
        }
        match body.len().checked_sub(padding) {
            Some(end) => self.fragment.extend_from_slice(&body[..end]),
            None => self.malformed = true,
        }
    }

    fn reencode(&self, decoder: &mut Decoder<'_>) -> Reencoded {
        if self.malformed {
            return Reencoded::Undecodable;
        }
        let mut encoded = Vec::with_capacity(self.fragment.len() + 64);
        let mut decoded = 0usize;
        let outcome = decoder.decode_with_cb(&self.fragment, |name, value| {
            decoded += name.len() + value.len() + 32;
            if decoded > MAX_DECODED {
                return;
            }
            let value: &[u8] = if &*name == b":authority" && !valid_authority(&value) {
                LOCAL_AUTHORITY
            } else {
                &value
            };
            put_literal(&mut encoded, &name, value);
        });
        match outcome {
            Err(_) => Reencoded::Undecodable,
            Ok(()) if decoded > MAX_DECODED => Reencoded::TooLarge,
            Ok(()) => Reencoded::Frames(self.frames(&encoded)),
        }
    }

    /// `encoded` as a HEADERS frame (with this block's END_STREAM and
    /// priority) and as many CONTINUATIONs as MAX_FRAME requires.
    fn frames(&self, encoded: &[u8]) -> Vec<u8> {
        let priority = self.priority.as_ref().map_or(&[][..], |p| &p[..]);
        let first = encoded.len().min(MAX_FRAME - priority.len());
        let (head, mut rest) = encoded.split_at(first);
        let mut flags = if self.end_stream { END_STREAM } else { 0 };
        flags |= if self.priority.is_some() { PRIORITY } else { 0 };
        flags |= if rest.is_empty() { END_HEADERS } else { 0 };
        let mut out = Vec::with_capacity(encoded.len() + 5 + 9 * (1 + encoded.len() / MAX_FRAME));
        put_frame_header(
            &mut out,
            priority.len() + head.len(),
            HEADERS,
            flags,
            self.stream,
        );
        out.extend_from_slice(priority);
        out.extend_from_slice(head);
        while !rest.is_empty() {
            let (part, after) = rest.split_at(rest.len().min(MAX_FRAME));
            let flags = if after.is_empty() { END_HEADERS } else { 0 };
            put_frame_header(&mut out, part.len(), CONTINUATION, flags, self.stream);
            out.extend_from_slice(part);
            rest = after;
        }
        out
    }
}

/// What h2 itself accepts as `:authority` (the same parser).
fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

fn put_frame_header(out: &mut Vec<u8>, length: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&(length as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// RFC 7541 6.2.2: a literal header field without indexing, new name, no
/// Huffman coding: it leaves the decoder's dynamic table as it was.
fn put_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    put_string(out, name);
    put_string(out, value);
}

fn put_string(out: &mut Vec<u8>, text: &[u8]) {
    put_integer(out, 7, text.len());
    out.extend_from_slice(text);
}

/// RFC 7541 5.1: an integer with an N-bit prefix (the prefix's other bits 0).
fn put_integer(out: &mut Vec<u8>, prefix_bits: u32, value: usize) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(value as u8);
        return;
    }
    out.push(max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128 + 128) as u8);
        rest /= 128;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    type Headers = Vec<(Vec<u8>, Vec<u8>)>;

    fn headers_frame(block: &[u8], flags: u8, stream: u32) -> Vec<u8> {
        let mut out = Vec::new();
        put_frame_header(&mut out, block.len(), HEADERS, flags, stream);
        out.extend_from_slice(block);
        out
    }

    fn decode(frames: &[u8]) -> (Headers, u8) {
        assert_eq!(frames[3], HEADERS);
        let length = u32::from_be_bytes([0, frames[0], frames[1], frames[2]]) as usize;
        let mut headers = Vec::new();
        Decoder::new()
            .decode_with_cb(&frames[9..9 + length], |n, v| {
                headers.push((n.to_vec(), v.to_vec()))
            })
            .expect("the relay's block decodes");
        (headers, frames[4])
    }

    async fn relayed(input: Vec<u8>) -> Vec<u8> {
        let mut output = Vec::new();
        let _ = relay(&mut &input[..], &mut output).await;
        output
    }

    fn grpcio_request(authority: &[u8]) -> Headers {
        vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/grpc.health.v1.Health/Check".to_vec()),
            (b":authority".to_vec(), authority.to_vec()),
            (b"te".to_vec(), b"trailers".to_vec()),
        ]
    }

    #[tokio::test]
    async fn a_socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut input = Vec::new();
        for authority in [
            &b"%2Frun%2Fstratad.sock"[..],
            b"/run/stratad.sock",
            b"host:1",
        ] {
            let headers = grpcio_request(authority);
            let block = encoder.encode(headers.iter().map(|(n, v)| (&n[..], &v[..])));
            input.extend(headers_frame(&block, END_HEADERS | END_STREAM, 1));
        }
        let data = [0, 0, 2, 0, 0, 0, 0, 0, 1, 7, 7]; // DATA, 2 bytes, stream 1
        input.extend_from_slice(&data);
        let output = relayed(input).await;
        let mut at = 0;
        for expected in [&b"localhost"[..], b"localhost", b"host:1"] {
            let length = u32::from_be_bytes([0, output[at], output[at + 1], output[at + 2]]);
            let (headers, flags) = decode(&output[at..]);
            assert_eq!(headers, grpcio_request(expected));
            assert_eq!(flags, END_HEADERS | END_STREAM);
            at += 9 + length as usize;
        }
        assert_eq!(&output[at..], &data, "other frames pass byte for byte");
    }

    #[tokio::test]
    async fn a_large_block_is_split_and_priority_and_padding_are_handled() {
        let mut headers = grpcio_request(b"/tmp/s");
        headers.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block =
            loona_hpack::Encoder::new().encode(headers.iter().map(|(n, v)| (&n[..], &v[..])));
        // Sent as HEADERS (padded, with priority) + CONTINUATIONs of 16 KiB.
        let mut input = Vec::new();
        let (first, mut rest) = block.split_at(10_000);
        let mut payload = vec![3u8]; // pad length
        payload.extend_from_slice(&[0, 0, 0, 0, 15]);
        payload.extend_from_slice(first);
        payload.extend_from_slice(&[0, 0, 0]);
        input.extend(headers_frame(&payload, PADDED | PRIORITY, 3));
        while !rest.is_empty() {
            let (part, after) = rest.split_at(rest.len().min(MAX_FRAME));
            let flags = if after.is_empty() { END_HEADERS } else { 0 };
            put_frame_header(&mut input, part.len(), CONTINUATION, flags, 3);
            input.extend_from_slice(part);
            rest = after;
        }
        let output = relayed(input).await;
        let mut fragment = Vec::new();
        let mut at = 0;
        while at < output.len() {
            let length =
                u32::from_be_bytes([0, output[at], output[at + 1], output[at + 2]]) as usize;
            assert!(length <= MAX_FRAME);
            let body = &output[at + 9..at + 9 + length];
            if at == 0 {
                assert_eq!(output[3], HEADERS);
                assert_eq!(output[4], PRIORITY, "priority kept, padding dropped");
                assert_eq!(&body[..5], &[0, 0, 0, 0, 15]);
                fragment.extend_from_slice(&body[5..]);
            } else {
                assert_eq!(output[at + 3], CONTINUATION);
                fragment.extend_from_slice(body);
            }
            at += 9 + length;
        }
        let mut decoded = Vec::new();
        Decoder::new()
            .decode_with_cb(&fragment, |n, v| decoded.push((n.to_vec(), v.to_vec())))
            .unwrap();
        let mut expected = grpcio_request(b"localhost");
        expected.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        assert_eq!(decoded, expected);
    }

    #[tokio::test]
    async fn what_the_relay_cannot_decode_reaches_h2_as_sent() {
        // Index 70: not in the static table, and the dynamic table is empty.
        let mut input = headers_frame(&[0x80 | 70], END_HEADERS, 1);
        let after = [0, 0, 0, 4, 0, 0, 0, 0, 0]; // SETTINGS
        input.extend_from_slice(&after);
        assert_eq!(relayed(input.clone()).await, input);
        // A CONTINUATION on another stream than its HEADERS: h2 sees both as sent.
        let mut split = headers_frame(&[0x82], 0, 1);
        put_frame_header(&mut split, 1, CONTINUATION, END_HEADERS, 3);
        split.push(0x84);
        assert_eq!(relayed(split.clone()).await, split);
    }

    #[tokio::test]
    async fn an_hpack_bomb_ends_the_connection() {
        // One 4 KiB entry in the table, then a block indexing it 200 times.
        let mut block = vec![0x40];
        put_string(&mut block, b"x-bomb");
        put_string(&mut block, &[b'b'; 4000]);
        let mut input = headers_frame(&block, END_HEADERS, 1);
        input.extend(headers_frame(&[0x80 | 62; 200], END_HEADERS, 3));
        let output = relayed(input).await;
        let length = u32::from_be_bytes([0, output[0], output[1], output[2]]) as usize;
        assert_eq!(
            output.len(),
            9 + length,
            "the first block only, then nothing"
        );
    }
}
