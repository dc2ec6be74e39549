//! ``RunState`` written as JSON, byte for byte as the store's ``_run_json`` writes it
//! with pydantic (compact, declaration order, fields at their default left out,
//! URL-safe base64 bytes with padding, integer dict keys as strings, strings escaped
//! as serde_json escapes them), straight into one buffer.
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

    /// ``value`` under ``key``, left out when it is the field's default (pydantic's
    /// ``exclude_defaults``: the reader fills defaults back in).
    fn field_unless<T: Json + ?Sized>(&mut self, is_default: bool, key: &str, value: &T) {
        if !is_default {
            value.write(self.field(key));
        }
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
        o.field_unless(self.status == "open", "status", &self.status);
        o.field_unless(self.outcome.is_none(), "outcome", &self.outcome);
        o.field_unless(self.digest.is_none(), "digest", &self.digest);
        o.field_unless(self.output.is_none(), "output", &self.output);
        o.field_unless(self.error.is_none(), "error", &self.error);
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
        o.field_unless(self.status == "running", "status", &self.status);
        o.field_unless(self.version == 0, "version", &self.version);
        self.input.write(o.field("input"));
        self.submitted_ms.write(o.field("submitted_ms"));
        self.created_ms.write(o.field("created_ms"));
        self.updated_ms.write(o.field("updated_ms"));
        o.field_unless(
            self.idempotency_key.is_none(),
            "idempotency_key",
            &self.idempotency_key,
        );
        o.field_unless(self.fingerprint.is_none(), "fingerprint", &self.fingerprint);
        self.submit_command_id.write(o.field("submit_command_id"));
        o.field_unless(self.segment == 0, "segment", &self.segment);
        o.field_unless(self.attempt == 0, "attempt", &self.attempt);
        o.field_unless(self.generation == 0, "generation", &self.generation);
        o.field_unless(self.next_step == 0, "next_step", &self.next_step);
        o.field_unless(
            self.step_attempts == 0,
            "step_attempts",
            &self.step_attempts,
        );
        self.last_output.write(o.field("last_output"));
        o.field_unless(self.phase == "idle", "phase", &self.phase);
        o.field_unless(
            self.attempt_expires_ms.is_none(),
            "attempt_expires_ms",
            &self.attempt_expires_ms,
        );
        o.field_unless(
            self.retry_due_ms.is_none(),
            "retry_due_ms",
            &self.retry_due_ms,
        );
        o.field_unless(
            self.retry_reason.is_none(),
            "retry_reason",
            &self.retry_reason,
        );
        o.field_unless(
            self.completed_steps.is_empty(),
            "completed_steps",
            &self.completed_steps,
        );
        o.field_unless(self.boundary == 0, "boundary", &self.boundary);
        o.field_unless(
            self.boundary_step.is_none(),
            "boundary_step",
            &self.boundary_step,
        );
        o.field_unless(
            self.boundary_kind == "await",
            "boundary_kind",
            &self.boundary_kind,
        );
        o.field_unless(
            !self.boundary_itemized,
            "boundary_itemized",
            &self.boundary_itemized,
        );
        o.field_unless(
            self.boundary_items == 0,
            "boundary_items",
            &self.boundary_items,
        );
        o.field_unless(
            self.boundary_on_timeout == "fail",
            "boundary_on_timeout",
            &self.boundary_on_timeout,
        );
        o.field_unless(
            !self.boundary_dispatched,
            "boundary_dispatched",
            &self.boundary_dispatched,
        );
        o.field_unless(
            self.boundary_total == 0,
            "boundary_total",
            &self.boundary_total,
        );
        o.field_unless(
            self.boundary_settled == 0,
            "boundary_settled",
            &self.boundary_settled,
        );
        o.field_unless(
            self.boundary_failed == 0,
            "boundary_failed",
            &self.boundary_failed,
        );
        o.field_unless(self.sleep_step.is_none(), "sleep_step", &self.sleep_step);
        o.field_unless(
            self.sleep_wake_ms.is_none(),
            "sleep_wake_ms",
            &self.sleep_wake_ms,
        );
        o.field_unless(
            self.interactions.is_empty(),
            "interactions",
            &self.interactions,
        );
        o.field_unless(
            self.publications.is_empty(),
            "publications",
            &self.publications,
        );
        o.field_unless(
            self.publication_key.is_none(),
            "publication_key",
            &self.publication_key,
        );
        o.field_unless(
            self.publication_due_ms.is_none(),
            "publication_due_ms",
            &self.publication_due_ms,
        );
        o.field_unless(self.result.is_none(), "result", &self.result);
        o.field_unless(self.error.is_none(), "error", &self.error);
        o.field_unless(self.error_type.is_none(), "error_type", &self.error_type);
        o.field_unless(self.failed_step.is_none(), "failed_step", &self.failed_step);
        o.field_unless(
            self.failed_attempts == 0,
            "failed_attempts",
            &self.failed_attempts,
        );
        o.field_unless(self.deadline_ms.is_none(), "deadline_ms", &self.deadline_ms);
        o.field_unless(self.stop_reason.is_none(), "stop_reason", &self.stop_reason);
        o.field_unless(self.stop_detail.is_none(), "stop_detail", &self.stop_detail);
        o.field_unless(self.unknown.is_none(), "unknown", &self.unknown);
        o.field_unless(
            self.step_outputs.is_empty(),
            "step_outputs",
            &self.step_outputs,
        );
        o.field_unless(
            self.resolutions.is_empty(),
            "resolutions",
            &self.resolutions,
        );
        o.field_unless(self.unwind.is_empty(), "unwind", &self.unwind);
        o.field_unless(
            !self.compensation_started,
            "compensation_started",
            &self.compensation_started,
        );
        o.field_unless(
            self.compensating_step.is_none(),
            "compensating_step",
            &self.compensating_step,
        );
        o.field_unless(
            self.compensation_attempt == 0,
            "compensation_attempt",
            &self.compensation_attempt,
        );
        o.field_unless(
            self.compensation_generation == 0,
            "compensation_generation",
            &self.compensation_generation,
        );
        o.field_unless(
            self.compensation_expires_ms.is_none(),
            "compensation_expires_ms",
            &self.compensation_expires_ms,
        );
        o.field_unless(
            self.compensation_retry_due_ms.is_none(),
            "compensation_retry_due_ms",
            &self.compensation_retry_due_ms,
        );
        o.field_unless(
            self.compensation_retry_reason.is_none(),
            "compensation_retry_reason",
            &self.compensation_retry_reason,
        );
        o.field_unless(self.compensated == 0, "compensated", &self.compensated);
        o.field_unless(self.skipped == 0, "skipped", &self.skipped);
        o.field_unless(
            !self.compensation_failed,
            "compensation_failed",
            &self.compensation_failed,
        );
        o.field_unless(self.execution.is_none(), "execution", &self.execution);
        o.field_unless(self.recovery.is_none(), "recovery", &self.recovery);
        o.field_unless(self.traceparent.is_none(), "traceparent", &self.traceparent);
        o.field_unless(
            self.attempt_started_step.is_none(),
            "attempt_started_step",
            &self.attempt_started_step,
        );
        o.field_unless(
            self.attempt_worker.is_none(),
            "attempt_worker",
            &self.attempt_worker,
        );
        o.field_unless(
            self.heartbeat_due_ms.is_none(),
            "heartbeat_due_ms",
            &self.heartbeat_due_ms,
        );
        o.field_unless(
            self.infrastructure_losses == 0,
            "infrastructure_losses",
            &self.infrastructure_losses,
        );
        o.field_unless(
            self.compensation_worker.is_none(),
            "compensation_worker",
            &self.compensation_worker,
        );
        o.field_unless(
            self.compensation_heartbeat_due_ms.is_none(),
            "compensation_heartbeat_due_ms",
            &self.compensation_heartbeat_due_ms,
        );
        o.close();
    }
}

/// The run's JSON, as pydantic's ``model_dump_json`` writes it, appended to ``out``.
pub fn write_run(state: &RunState, out: &mut Vec<u8>) {
    state.write(out);
}
