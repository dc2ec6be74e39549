//! The run projection, field for field as ``processor/model/state.py`` declares it,
//! read from the JSON the store holds (``json.rs`` writes it; a field left out is at
//! its default).

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
    #[serde(default = "open")]
    pub status: String,
    #[serde(default)]
    pub outcome: Option<String>,
    #[serde(default)]
    pub digest: Option<B64>,
    #[serde(default)]
    pub output: Option<B64>,
    #[serde(default)]
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
    #[serde(default = "running")]
    pub status: String,
    #[serde(default)]
    pub version: i64,
    pub input: B64,
    pub submitted_ms: i64,
    pub created_ms: i64,
    pub updated_ms: i64,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub fingerprint: Option<String>,
    pub submit_command_id: String,
    #[serde(default)]
    pub segment: i64,
    #[serde(default)]
    pub attempt: i64,
    #[serde(default)]
    pub generation: i64,
    #[serde(default)]
    pub next_step: i64,
    #[serde(default)]
    pub step_attempts: i64,
    pub last_output: B64,
    #[serde(default = "idle")]
    pub phase: String,
    #[serde(default)]
    pub attempt_expires_ms: Option<i64>,
    #[serde(default)]
    pub retry_due_ms: Option<i64>,
    #[serde(default)]
    pub retry_reason: Option<String>,
    #[serde(default)]
    pub completed_steps: Vec<i64>,
    #[serde(default)]
    pub boundary: i64,
    #[serde(default)]
    pub boundary_step: Option<i64>,
    #[serde(default = "await_")]
    pub boundary_kind: String,
    #[serde(default)]
    pub boundary_itemized: bool,
    #[serde(default)]
    pub boundary_items: i64,
    #[serde(default = "fail")]
    pub boundary_on_timeout: String,
    #[serde(default)]
    pub boundary_dispatched: bool,
    #[serde(default)]
    pub boundary_total: i64,
    #[serde(default)]
    pub boundary_settled: i64,
    #[serde(default)]
    pub boundary_failed: i64,
    #[serde(default)]
    pub sleep_step: Option<i64>,
    #[serde(default)]
    pub sleep_wake_ms: Option<i64>,
    #[serde(default)]
    pub interactions: IndexMap<String, Interaction>,
    #[serde(default)]
    pub publications: IndexMap<String, String>,
    #[serde(default)]
    pub publication_key: Option<String>,
    #[serde(default)]
    pub publication_due_ms: Option<i64>,
    #[serde(default)]
    pub result: Option<B64>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub error_type: Option<String>,
    #[serde(default)]
    pub failed_step: Option<i64>,
    #[serde(default)]
    pub failed_attempts: i64,
    #[serde(default)]
    pub deadline_ms: Option<i64>,
    #[serde(default)]
    pub stop_reason: Option<String>,
    #[serde(default)]
    pub stop_detail: Option<String>,
    #[serde(default)]
    pub unknown: Option<UnknownAttempt>,
    #[serde(default)]
    pub step_outputs: IndexMap<i64, B64>,
    #[serde(default)]
    pub resolutions: IndexMap<String, RecordedResolution>,
    #[serde(default)]
    pub unwind: Vec<i64>,
    #[serde(default)]
    pub compensation_started: bool,
    #[serde(default)]
    pub compensating_step: Option<i64>,
    #[serde(default)]
    pub compensation_attempt: i64,
    #[serde(default)]
    pub compensation_generation: i64,
    #[serde(default)]
    pub compensation_expires_ms: Option<i64>,
    #[serde(default)]
    pub compensation_retry_due_ms: Option<i64>,
    #[serde(default)]
    pub compensation_retry_reason: Option<String>,
    #[serde(default)]
    pub compensated: i64,
    #[serde(default)]
    pub skipped: i64,
    #[serde(default)]
    pub compensation_failed: bool,
    #[serde(default)]
    pub execution: Option<String>,
    #[serde(default)]
    pub recovery: Option<String>,
    #[serde(default)]
    pub traceparent: Option<String>,
    #[serde(default)]
    pub attempt_started_step: Option<i64>,
    #[serde(default)]
    pub attempt_worker: Option<String>,
    #[serde(default)]
    pub heartbeat_due_ms: Option<i64>,
    #[serde(default)]
    pub infrastructure_losses: i64,
    #[serde(default)]
    pub compensation_worker: Option<String>,
    #[serde(default)]
    pub compensation_heartbeat_due_ms: Option<i64>,
}

/// The run row's fields this build reads and writes, in ``RunRow``'s order (all but
/// ``redrives``): ``native_fold.py`` uses a build only if they are the row's, so an
/// older build never writes rows without the fields added since.
pub const ROW_FIELDS: [&str; 70] = [
    "run_id",
    "pipeline",
    "pipeline_version",
    "status",
    "version",
    "input",
    "submitted_ms",
    "created_ms",
    "updated_ms",
    "idempotency_key",
    "fingerprint",
    "submit_command_id",
    "segment",
    "attempt",
    "generation",
    "next_step",
    "step_attempts",
    "last_output",
    "phase",
    "attempt_expires_ms",
    "retry_due_ms",
    "retry_reason",
    "completed_steps",
    "boundary",
    "boundary_step",
    "boundary_kind",
    "boundary_itemized",
    "boundary_items",
    "boundary_on_timeout",
    "boundary_dispatched",
    "boundary_total",
    "boundary_settled",
    "boundary_failed",
    "sleep_step",
    "sleep_wake_ms",
    "interactions",
    "publications",
    "publication_key",
    "publication_due_ms",
    "result",
    "error",
    "error_type",
    "failed_step",
    "failed_attempts",
    "deadline_ms",
    "stop_reason",
    "stop_detail",
    "unknown",
    "step_outputs",
    "resolutions",
    "unwind",
    "compensation_started",
    "compensating_step",
    "compensation_attempt",
    "compensation_generation",
    "compensation_expires_ms",
    "compensation_retry_due_ms",
    "compensation_retry_reason",
    "compensated",
    "skipped",
    "compensation_failed",
    "execution",
    "recovery",
    "traceparent",
    "attempt_started_step",
    "attempt_worker",
    "heartbeat_due_ms",
    "infrastructure_losses",
    "compensation_worker",
    "compensation_heartbeat_due_ms",
];

// The defaults of the string fields that have one, as ``model/state.py`` declares them:
// ``json.rs`` leaves a field at its default out.
fn running() -> String {
    "running".into()
}

fn idle() -> String {
    "idle".into()
}

fn await_() -> String {
    "await".into()
}

fn fail() -> String {
    "fail".into()
}

fn open() -> String {
    "open".into()
}

pub const TERMINAL: [&str; 4] = ["succeeded", "failed", "cancelled", "timed_out"];

impl RunState {
    pub fn terminal(&self) -> bool {
        TERMINAL.contains(&self.status.as_str())
    }

    /// Whether the run waits at a child boundary with a child still open
    /// (``waits.children_open``): a stop then waits for the children's outcomes.
    pub fn children_open(&self) -> bool {
        self.boundary_kind == "child"
            && self
                .interactions
                .values()
                .any(|i| i.boundary == self.boundary && i.kind == "child" && i.status == "open")
    }

    /// Whether a stopping chain no longer suspended still waits for its children
    /// (``waits.IDLE``'s hold): its child step failed, and the others were cancelled.
    pub fn stop_held_by_children(&self) -> bool {
        self.stop_reason.is_some() && !self.terminal() && self.children_open()
    }

    /// What ``interaction`` adds to the boundary's counts (``Boundary.recounted``):
    /// (total, settled, failed), nothing unless it is the boundary's.
    fn tally(&self, interaction: &Interaction) -> (i64, i64, i64) {
        if interaction.boundary != self.boundary {
            return (0, 0, 0);
        }
        let settled = interaction.status == "admitted" || interaction.status == "timed_out";
        let failed = match interaction.status.as_str() {
            "admitted" => interaction.outcome.as_deref() == Some("failure"),
            "timed_out" => self.boundary_on_timeout == "fail",
            _ => false,
        };
        (1, i64::from(settled), i64::from(failed))
    }

    /// The boundary's counts once ``after`` replaced ``before`` (None: added).
    pub fn recount(&mut self, before: Option<&Interaction>, after: &Interaction) {
        let (t0, s0, f0) = before.map_or((0, 0, 0), |i| self.tally(i));
        let (t1, s1, f1) = self.tally(after);
        self.boundary_total += t1 - t0;
        self.boundary_settled += s1 - s0;
        self.boundary_failed += f1 - f0;
    }

    /// The boundary's counts read from every interaction (``Boundary.counted``).
    pub fn count_boundary(&mut self) {
        let (mut total, mut settled, mut failed) = (0, 0, 0);
        for interaction in self.interactions.values() {
            let (t, s, f) = self.tally(interaction);
            total += t;
            settled += s;
            failed += f;
        }
        self.boundary_total = total;
        self.boundary_settled = settled;
        self.boundary_failed = failed;
    }

    pub fn from_json(raw: &[u8]) -> Result<RunState, String> {
        serde_json::from_slice(raw).map_err(|e| e.to_string())
    }
}
