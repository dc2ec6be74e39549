//! The run projection, field for field as ``processor/model/state.py`` declares it,
//! read from the JSON pydantic writes (``json.rs`` writes it back).

use base64::engine::general_purpose::URL_SAFE;
use base64::Engine;
use indexmap::IndexMap;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// Bytes, in JSON as pydantic's ``ser_json_bytes="base64"`` writes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct B64(pub Vec<u8>);

impl<'de> Deserialize<'de> for B64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        // Only what ``json.rs`` writes; anything else is left to pydantic.
        let decoded = URL_SAFE.decode(text.as_bytes()).map_err(D::Error::custom)?;
        if URL_SAFE.encode(&decoded) != text {
            return Err(D::Error::custom("not canonical URL-safe base64"));
        }
        Ok(B64(decoded))
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interaction {
    pub boundary: i64,
    pub item_index: i64,
    pub kind: String,
    pub target: String,
    pub deadline_ms: i64,
    pub token_digest: B64,
    pub status: String,
    pub outcome: Option<String>,
    pub digest: Option<B64>,
    pub output: Option<B64>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnknownAttempt {
    pub kind: String,
    pub segment: i64,
    pub attempt: i64,
    pub generation: i64,
    pub step: i64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedResolution {
    pub fingerprint: String,
    pub response: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunState {
    pub run_id: String,
    pub pipeline: String,
    pub pipeline_version: i64,
    pub status: String,
    pub version: i64,
    pub input: B64,
    pub submitted_ms: i64,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub idempotency_key: Option<String>,
    pub fingerprint: Option<String>,
    pub submit_command_id: String,
    pub segment: i64,
    pub attempt: i64,
    pub generation: i64,
    pub next_step: i64,
    pub step_attempts: i64,
    pub last_output: B64,
    pub phase: String,
    pub attempt_expires_ms: Option<i64>,
    pub retry_due_ms: Option<i64>,
    pub completed_steps: Vec<i64>,
    pub boundary: i64,
    pub boundary_step: Option<i64>,
    pub boundary_kind: String,
    pub boundary_itemized: bool,
    pub boundary_items: i64,
    pub boundary_on_timeout: String,
    pub boundary_dispatched: bool,
    pub interactions: IndexMap<String, Interaction>,
    pub publications: IndexMap<String, String>,
    pub publication_key: Option<String>,
    pub publication_due_ms: Option<i64>,
    pub result: Option<B64>,
    pub error: Option<String>,
    pub error_type: Option<String>,
    pub failed_step: Option<i64>,
    pub failed_attempts: i64,
    pub deadline_ms: Option<i64>,
    pub stop_reason: Option<String>,
    pub stop_detail: Option<String>,
    pub unknown: Option<UnknownAttempt>,
    pub step_outputs: IndexMap<i64, B64>,
    pub resolutions: IndexMap<String, RecordedResolution>,
    pub unwind: Vec<i64>,
    pub compensation_started: bool,
    pub compensating_step: Option<i64>,
    pub compensation_attempt: i64,
    pub compensation_generation: i64,
    pub compensation_expires_ms: Option<i64>,
    pub compensation_retry_due_ms: Option<i64>,
    pub compensated: i64,
    pub skipped: i64,
    pub compensation_failed: bool,
    pub execution: Option<String>,
    pub recovery: Option<String>,
}

pub const TERMINAL: [&str; 4] = ["succeeded", "failed", "cancelled", "timed_out"];

impl RunState {
    pub fn terminal(&self) -> bool {
        TERMINAL.contains(&self.status.as_str())
    }

    pub fn from_json(raw: &[u8]) -> Result<RunState, String> {
        serde_json::from_slice(raw).map_err(|e| e.to_string())
    }
}
