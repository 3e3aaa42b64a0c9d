//! Measures FastCDC size candidates on the reference workload (DESIGN.md
//! section 8, "the growing conversation") to choose the default chunk sizes.
//!
//! The messages come from Python (the workload is defined by Python's
//! `random.Random(7)`), one JSON object per line, written by:
//!
//! ```sh
//! python3 -c "import sys, json; sys.path.insert(0, 'bench'); import _workload as w; \
//!   [print(json.dumps(w.message(j), separators=(',', ':'))) for j in range(500)]" \
//!   > /tmp/messages.jsonl
//! cargo run --release -p stratad-core --example chunk_sizes -- /tmp/messages.jsonl [steps]
//! ```
//!
//! For each (min, avg, max) candidate it saves every step's state as a
//! content-addressed store would: cut, digest, and frame (zstd level 3) only
//! the chunks not stored yet. It reports the unique framed bytes, the chunks
//! per checkpoint (a manifest costs about 40 bytes per chunk), the manifest
//! bytes over all checkpoints, what a client would upload per step (the
//! uncompressed bytes of the chunks the store lacks), and throughput: of
//! cutting and digesting every chunk, and of cutting, digesting and framing
//! every chunk (one zstd context reused for all).

use std::collections::HashSet;
use std::time::Instant;

use stratad_core::chunking::chunk_boundaries;
use stratad_core::digest::digest;
use stratad_core::frame::FrameEncoder;

const MANIFEST_BYTES_PER_CHUNK: usize = 40;

/// The JSON state of step `i` from the first `i + 1` messages, byte for byte
/// what `json.dumps(state, separators=(",", ":"))` produces.
fn state(messages: &[String], i: usize) -> Vec<u8> {
    let mut out = String::from("{\"messages\":[");
    out.push_str(&messages[..=i].join(","));
    out.push_str(&format!(
        "],\"step\":{i},\"scratch\":{{\"tool\":\"search\",\"n\":{i}}}}}"
    ));
    out.into_bytes()
}

struct Row {
    sizes: (usize, usize, usize),
    unique_chunks: usize,
    unique_framed: usize,
    chunks_last: usize,
    chunks_mean: f64,
    manifests: usize,
    upload_per_step: f64,
    cut_digest_mbps: f64,
    frame_mbps: f64,
}

fn measure(states: &[Vec<u8>], sizes: (usize, usize, usize)) -> Row {
    let (min, avg, max) = sizes;
    let mut encoder = FrameEncoder::new(3).expect("level 3");
    let mut seen: HashSet<[u8; 32]> = HashSet::new();
    let mut unique_framed = 0;
    let mut total_chunks = 0;
    let mut chunks_last = 0;
    let mut uploaded = 0;
    for data in states {
        let bounds = chunk_boundaries(data, min, avg, max).expect("valid sizes");
        total_chunks += bounds.len();
        chunks_last = bounds.len();
        for (offset, length) in bounds {
            let piece = &data[offset..offset + length];
            if seen.insert(digest(piece)) {
                unique_framed += encoder.encode(piece).expect("frame").len();
                uploaded += length;
            }
        }
    }
    let input: usize = states.iter().map(Vec::len).sum();
    // Throughput over the last 100 states (the largest).
    let tail = &states[states.len().saturating_sub(100)..];
    let tail_bytes: usize = tail.iter().map(Vec::len).sum();
    let start = Instant::now();
    let mut sink = 0u8;
    for data in tail {
        for (offset, length) in chunk_boundaries(data, min, avg, max).expect("valid") {
            sink ^= digest(&data[offset..offset + length])[0];
        }
    }
    let cut_digest = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for data in tail {
        for (offset, length) in chunk_boundaries(data, min, avg, max).expect("valid") {
            let piece = &data[offset..offset + length];
            sink ^= digest(piece)[0];
            sink ^= encoder.encode(piece).expect("frame")[0];
        }
    }
    let frame = start.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    let _ = input;
    Row {
        sizes,
        unique_chunks: seen.len(),
        unique_framed,
        chunks_last,
        chunks_mean: total_chunks as f64 / states.len() as f64,
        manifests: total_chunks * MANIFEST_BYTES_PER_CHUNK,
        upload_per_step: uploaded as f64 / states.len() as f64,
        cut_digest_mbps: tail_bytes as f64 / cut_digest / 1e6,
        frame_mbps: tail_bytes as f64 / frame / 1e6,
    }
}

fn kib(n: usize) -> String {
    if n % 1024 == 0 {
        format!("{}K", n / 1024)
    } else {
        n.to_string()
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: chunk_sizes MESSAGES.jsonl [STEPS] (see the doc comment)");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(&path).expect("read the messages file");
    let messages: Vec<String> = text.lines().map(str::to_owned).collect();
    let steps: usize = args
        .next()
        .map_or(messages.len(), |s| s.parse().expect("STEPS is a number"));
    assert!(
        steps <= messages.len(),
        "not enough messages for {steps} steps"
    );
    let states: Vec<Vec<u8>> = (0..steps).map(|i| state(&messages, i)).collect();
    let input: usize = states.iter().map(Vec::len).sum();
    println!(
        "{steps} steps, {:.1} MB of states in total, last state {} bytes\n",
        input as f64 / 1e6,
        states.last().map_or(0, Vec::len)
    );
    println!(
        "| min/avg/max | unique chunks | unique framed bytes | chunks per checkpoint (mean / last) \
         | manifest bytes (all checkpoints) | framed + manifests | upload per step | cut+digest MB/s | cut+digest+frame MB/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for sizes in [
        (512, 2048, 8192),
        (1024, 4096, 16384),
        (2048, 8192, 32768),
        (4096, 16384, 65536),
        (8192, 32768, 131072),
    ] {
        let row = measure(&states, sizes);
        println!(
            "| {}/{}/{} | {} | {} | {:.1} / {} | {} | {} | {:.0} B | {:.0} | {:.0} |",
            kib(row.sizes.0),
            kib(row.sizes.1),
            kib(row.sizes.2),
            row.unique_chunks,
            row.unique_framed,
            row.chunks_mean,
            row.chunks_last,
            row.manifests,
            row.unique_framed + row.manifests,
            row.upload_per_step,
            row.cut_digest_mbps,
            row.frame_mbps,
        );
    }
}
