//! ``RunState`` written as JSON, byte for byte as pydantic writes it (compact,
//! declaration order, URL-safe base64 bytes with padding, integer dict keys as
//! strings, strings escaped as serde_json escapes them), straight into one buffer.
//! The fold writes a run's JSON once per batch it appears in: serde's derive spent
//! most of its time re-scanning base64 text for characters to escape.

use base64::engine::general_purpose::URL_SAFE;
use base64::Engine;
use indexmap::IndexMap;

use crate::state::{Interaction, RecordedResolution, RunState, UnknownAttempt, B64};

/// A JSON object being written: ``field`` writes the separator and the key.
struct Object<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> Object<'o> {
    fn open(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        Object { out, first: true }
    }

    /// ``key`` must need no escaping (field names do not).
    fn field(&mut self, key: &str) -> &mut Vec<u8> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

trait Json {
    fn write(&self, out: &mut Vec<u8>);
}

impl Json for i64 {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(itoa::Buffer::new().format(*self).as_bytes());
    }
}

impl Json for bool {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(if *self { b"true" } else { b"false" });
    }
}

impl Json for String {
    fn write(&self, out: &mut Vec<u8>) {
        string(self, out);
    }
}

impl Json for B64 {
    fn write(&self, out: &mut Vec<u8>) {
        // The URL-safe alphabet and '=' never need escaping.
        out.push(b'"');
        let start = out.len();
        out.resize(start + self.0.len().div_ceil(3) * 4, 0);
        let written = URL_SAFE
            .encode_slice(&self.0, &mut out[start..])
            .expect("sized for padded base64");
        out.truncate(start + written);
        out.push(b'"');
    }
}

impl<T: Json> Json for Option<T> {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Some(value) => value.write(out),
            None => out.extend_from_slice(b"null"),
        }
    }
}

impl<T: Json> Json for Vec<T> {
    fn write(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        for (i, item) in self.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            item.write(out);
        }
        out.push(b']');
    }
}

/// A dict key: JSON object keys are strings, so integer keys are written as text.
trait Key {
    fn write_key(&self, out: &mut Vec<u8>);
}

impl Key for String {
    fn write_key(&self, out: &mut Vec<u8>) {
        string(self, out);
    }
}

impl Key for i64 {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.push(b'"');
        self.write(out);
        out.push(b'"');
    }
}

impl<K: Key, V: Json, S> Json for IndexMap<K, V, S> {
    fn write(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        for (i, (key, value)) in self.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            key.write_key(out);
            out.push(b':');
            value.write(out);
        }
        out.push(b'}');
    }
}

/// A JSON string as serde_json (so pydantic) writes it: UTF-8 as is; '"', '\\' and
/// control characters escaped, with the short forms where JSON has them.
fn string(text: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = text.as_bytes();
    if bytes.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.extend_from_slice(bytes);
    } else {
        for &b in bytes {
            match b {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0c => out.extend_from_slice(b"\\f"),
                0x00..=0x1f => {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    out.extend_from_slice(b"\\u00");
                    out.push(HEX[usize::from(b >> 4)]);
                    out.push(HEX[usize::from(b & 0xf)]);
                }
                _ => out.push(b),
            }
        }
    }
    out.push(b'"');
}

impl Json for Interaction {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        self.boundary.write(o.field("boundary"));
        self.item_index.write(o.field("item_index"));
        self.kind.write(o.field("kind"));
        self.target.write(o.field("target"));
        self.deadline_ms.write(o.field("deadline_ms"));
        self.token_digest.write(o.field("token_digest"));
        self.status.write(o.field("status"));
        self.outcome.write(o.field("outcome"));
        self.digest.write(o.field("digest"));
        self.output.write(o.field("output"));
        self.error.write(o.field("error"));
        o.close();
    }
}

impl Json for UnknownAttempt {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        self.kind.write(o.field("kind"));
        self.segment.write(o.field("segment"));
        self.attempt.write(o.field("attempt"));
        self.generation.write(o.field("generation"));
        self.step.write(o.field("step"));
        o.close();
    }
}

impl Json for RecordedResolution {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        self.fingerprint.write(o.field("fingerprint"));
        self.response.write(o.field("response"));
        o.close();
    }
}

impl Json for RunState {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        self.run_id.write(o.field("run_id"));
        self.pipeline.write(o.field("pipeline"));
        self.pipeline_version.write(o.field("pipeline_version"));
        self.status.write(o.field("status"));
        self.version.write(o.field("version"));
        self.input.write(o.field("input"));
        self.submitted_ms.write(o.field("submitted_ms"));
        self.created_ms.write(o.field("created_ms"));
        self.updated_ms.write(o.field("updated_ms"));
        self.idempotency_key.write(o.field("idempotency_key"));
        self.fingerprint.write(o.field("fingerprint"));
        self.submit_command_id.write(o.field("submit_command_id"));
        self.segment.write(o.field("segment"));
        self.attempt.write(o.field("attempt"));
        self.generation.write(o.field("generation"));
        self.next_step.write(o.field("next_step"));
        self.step_attempts.write(o.field("step_attempts"));
        self.last_output.write(o.field("last_output"));
        self.phase.write(o.field("phase"));
        self.attempt_expires_ms.write(o.field("attempt_expires_ms"));
        self.retry_due_ms.write(o.field("retry_due_ms"));
        self.completed_steps.write(o.field("completed_steps"));
        self.boundary.write(o.field("boundary"));
        self.boundary_step.write(o.field("boundary_step"));
        self.boundary_kind.write(o.field("boundary_kind"));
        self.boundary_itemized.write(o.field("boundary_itemized"));
        self.boundary_items.write(o.field("boundary_items"));
        self.boundary_on_timeout
            .write(o.field("boundary_on_timeout"));
        self.boundary_dispatched
            .write(o.field("boundary_dispatched"));
        self.interactions.write(o.field("interactions"));
        self.publications.write(o.field("publications"));
        self.publication_key.write(o.field("publication_key"));
        self.publication_due_ms.write(o.field("publication_due_ms"));
        self.result.write(o.field("result"));
        self.error.write(o.field("error"));
        self.error_type.write(o.field("error_type"));
        self.failed_step.write(o.field("failed_step"));
        self.failed_attempts.write(o.field("failed_attempts"));
        self.deadline_ms.write(o.field("deadline_ms"));
        self.stop_reason.write(o.field("stop_reason"));
        self.stop_detail.write(o.field("stop_detail"));
        self.unknown.write(o.field("unknown"));
        self.step_outputs.write(o.field("step_outputs"));
        self.resolutions.write(o.field("resolutions"));
        self.unwind.write(o.field("unwind"));
        self.compensation_started
            .write(o.field("compensation_started"));
        self.compensating_step.write(o.field("compensating_step"));
        self.compensation_attempt
            .write(o.field("compensation_attempt"));
        self.compensation_generation
            .write(o.field("compensation_generation"));
        self.compensation_expires_ms
            .write(o.field("compensation_expires_ms"));
        self.compensation_retry_due_ms
            .write(o.field("compensation_retry_due_ms"));
        self.compensated.write(o.field("compensated"));
        self.skipped.write(o.field("skipped"));
        self.compensation_failed
            .write(o.field("compensation_failed"));
        self.execution.write(o.field("execution"));
        self.recovery.write(o.field("recovery"));
        o.close();
    }
}

/// The run's JSON, as pydantic's ``model_dump_json`` writes it, appended to ``out``.
pub fn write_run(state: &RunState, out: &mut Vec<u8>) {
    state.write(out);
}
