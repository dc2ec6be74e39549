//! ``processor_native``: the replay fold compiled. ``Kernel.fold_into`` turns a batch
//! of encoded facts into the rows ``Staging.fold_read`` + ``flush`` would write and
//! puts them into a WriteBatch, or raises ``ValueError`` (before putting anything) for
//! whatever it does not handle exactly: the caller then folds that batch in Python,
//! the reference (``processor/store/native_fold.py``).

mod avro;
mod json;
mod reduce;
mod rows;
mod state;

use indexmap::IndexMap;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use rustc_hash::{FxBuildHasher, FxHashMap};

use avro::{FieldType, Plain, RecordSchema, Value};
use reduce::{Fact, FactSchema, Kind, Schemas, HEADER};
use state::RunState;

/// The fold allocates and frees a run's strings and bytes by the thousand per batch;
/// mimalloc does that in about three quarters of the time glibc's malloc takes (all of
/// it inside the extension: nothing allocated here is freed by Python, or the reverse).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MAGIC: [u8; 2] = [0xC3, 0x01];
const HEADER_LEN: usize = 10;

/// The rows of one batch.
#[derive(Default)]
struct Rows {
    history_keys: Vec<Vec<u8>>,
    history_chunks: Vec<Vec<u8>>,
    run_keys: Vec<Vec<u8>>,
    run_values: Vec<Vec<u8>>,
    due_puts: Vec<Vec<u8>>,
    due_deletes: Vec<Vec<u8>>,
    claim_keys: Vec<Vec<u8>>,
    claim_values: Vec<Vec<u8>>,
    /// Runs that began in this batch (were in neither the carry nor the store).
    started: usize,
}

/// Folds batches of one partition's facts, in log order, carrying the runs of each
/// batch to the next (as ``Staging(carry=True)`` does).
#[pyclass]
struct Kernel {
    schemas: Schemas,
    carried: FxHashMap<String, RunState>,
    /// A run's JSON is written here, then copied into its bytes (one buffer, reused).
    json: Vec<u8>,
}

#[pymethods]
impl Kernel {
    /// ``schemas``: (8-byte fingerprint, declared schema JSON) of each current fact schema.
    #[new]
    fn new(schemas: Vec<(Vec<u8>, String)>) -> PyResult<Self> {
        let mut parsed = Schemas::default();
        for (fingerprint, declared) in schemas {
            let fingerprint: [u8; 8] = fingerprint
                .try_into()
                .map_err(|_| PyValueError::new_err("a fingerprint has 8 bytes"))?;
            let json: serde_json::Value = serde_json::from_str(&declared)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            let schema = RecordSchema::parse(&json).map_err(PyValueError::new_err)?;
            let Some(kind) = Kind::of(&schema.name) else {
                return Err(PyValueError::new_err(format!(
                    "{} is not folded here",
                    schema.name
                )));
            };
            let names = schema.fields.iter().map(|(name, _)| name.as_str());
            let text = FieldType {
                plain: Plain::Str,
                null_branch: None,
            };
            let run_id_is_text = schema.fields.first().map(|(_, t)| *t) == Some(text);
            if !names.take(HEADER.len()).eq(HEADER) || !run_id_is_text {
                return Err(PyValueError::new_err(format!(
                    "{} lacks the fact header",
                    schema.name
                )));
            }
            parsed.insert(
                fingerprint,
                FactSchema {
                    record: schema,
                    kind,
                },
            );
        }
        Ok(Kernel {
            schemas: parsed,
            carried: FxHashMap::default(),
            json: Vec::with_capacity(4096),
        })
    }

    /// Forget the carried runs (after a batch folded elsewhere changed the store).
    fn reset(&mut self) {
        self.carried.clear();
    }

    /// Fold a batch of encoded facts and put its rows with ``put(key, value, family)``
    /// and ``delete(key, family)`` (a WriteBatch's methods); return how many runs
    /// began in it. ``families`` are the history, runs, due and claims column
    /// families. ``load(run_keys)`` answers the stored JSON (or None) of the runs not
    /// carried, by their keys. Raises ValueError before writing anything, and forgets
    /// the carried runs, for any value or stored run not handled exactly here.
    fn fold_into(
        &mut self,
        py: Python<'_>,
        values: &Bound<'_, PyList>,
        load: &Bound<'_, PyAny>,
        put: &Bound<'_, PyAny>,
        delete: &Bound<'_, PyAny>,
        families: [PyObject; 4],
    ) -> PyResult<usize> {
        let raws: Vec<Bound<'_, PyBytes>> = values
            .iter()
            .map(|value| value.downcast_into::<PyBytes>().map_err(PyErr::from))
            .collect::<PyResult<_>>()?;
        let slices: Vec<&[u8]> = raws.iter().map(|raw| raw.as_bytes()).collect();
        let result = self.fold(py, &slices, load);
        if result.is_err() {
            self.carried.clear();
        }
        let rows = result?;
        let [history, runs, due, claims] = families;
        let bytes = |data: &[u8]| PyBytes::new(py, data);
        for (key, chunk) in rows.history_keys.iter().zip(&rows.history_chunks) {
            put.call1((bytes(key), bytes(chunk), &history))?;
        }
        for (key, value) in rows.run_keys.iter().zip(&rows.run_values) {
            put.call1((bytes(key), bytes(value), &runs))?;
        }
        for key in &rows.due_deletes {
            delete.call1((bytes(key), &due))?;
        }
        let empty = bytes(b"");
        for key in &rows.due_puts {
            put.call1((bytes(key), &empty, &due))?;
        }
        for (key, value) in rows.claim_keys.iter().zip(&rows.claim_values) {
            put.call1((bytes(key), bytes(value), &claims))?;
        }
        Ok(rows.started)
    }
}

impl Kernel {
    /// Group the batch by run and load the runs not carried (with the GIL), then fold
    /// every run without it (``fold_runs`` touches no Python object), so other threads
    /// of the process run meanwhile: the catch-up pool's feeder, the processor's own.
    fn fold(
        &mut self,
        py: Python<'_>,
        values: &[&[u8]],
        load: &Bound<'_, PyAny>,
    ) -> PyResult<Rows> {
        let invalid = |e: String| PyValueError::new_err(e);
        // A run has a few facts in a batch: room for values / 4 runs spares most rehashing.
        let mut runs: IndexMap<&str, (), FxBuildHasher> =
            IndexMap::with_capacity_and_hasher(values.len() / 4, FxBuildHasher);
        let mut heads = Vec::with_capacity(values.len());
        for raw in values {
            let (schema, run_id, after_run_id) = head(&self.schemas, raw).map_err(invalid)?;
            heads.push(Head {
                schema,
                run: runs.insert_full(run_id, ()).0,
                after_run_id,
            });
        }
        let missing: Vec<&str> = runs
            .keys()
            .copied()
            .filter(|run_id| !self.carried.contains_key(*run_id))
            .collect();
        let mut stored: FxHashMap<&str, Option<RunState>> = FxHashMap::default();
        stored.reserve(missing.len());
        if !missing.is_empty() {
            let keys = missing
                .iter()
                .map(|run_id| PyBytes::new(py, &rows::string_key_of(run_id)));
            let answered: Vec<Option<Vec<u8>>> =
                load.call1((PyList::new(py, keys)?,))?.extract()?;
            if answered.len() != missing.len() {
                return Err(invalid("load answered a different number of runs".into()));
            }
            for (run_id, raw) in missing.iter().zip(answered) {
                let state = raw
                    .map(|raw| RunState::from_json(&raw))
                    .transpose()
                    .map_err(invalid)?;
                stored.insert(run_id, state);
            }
        }
        let batch = Batch {
            values,
            heads: &heads,
            runs: &runs,
        };
        let (carried, json) = (&mut self.carried, &mut self.json);
        py.allow_threads(|| fold_runs(&batch, carried, stored, json))
            .map_err(invalid)
    }
}

/// What the header pass learns of a value.
struct Head<'s> {
    schema: &'s FactSchema,
    /// The value's run: an index into ``Batch::runs``.
    run: usize,
    /// Where the value's body goes on after its run id (a history chunk leaves it out).
    after_run_id: usize,
}

/// One batch, grouped by run.
struct Batch<'b, 'a> {
    values: &'b [&'a [u8]],
    heads: &'b [Head<'b>],
    runs: &'b IndexMap<&'a str, (), FxBuildHasher>,
}

/// Fold each run of ``batch`` onto its state (``carried``, else ``stored``: None for a
/// run not in the store), and the rows that writes; ``carried`` becomes this batch's
/// runs. Each run's facts are decoded here, while they are fresh in the cache.
fn fold_runs<'a>(
    batch: &Batch<'_, 'a>,
    carried: &mut FxHashMap<String, RunState>,
    mut stored: FxHashMap<&'a str, Option<RunState>>,
    json: &mut Vec<u8>,
) -> Result<Rows, String> {
    let (starts, order) = by_run(batch.heads.iter().map(|head| head.run), batch.runs.len());
    let mut rows = Rows::default();
    let mut folded = FxHashMap::default();
    folded.reserve(batch.runs.len());
    let mut decoded: Vec<Value> = Vec::new();
    for (run, run_id) in batch.runs.keys().enumerate() {
        let members = &order[starts[run]..starts[run + 1]];
        decoded.clear();
        for &index in members {
            // The run id was read by the header pass: decode what follows it.
            let head = &batch.heads[index];
            decoded.push(Value::Str(run_id));
            head.schema.record.decode_from(
                batch.values[index],
                head.after_run_id,
                1,
                &mut decoded,
            )?;
        }
        let mut facts = Vec::with_capacity(members.len());
        let mut at = 0;
        for &index in members {
            let schema = batch.heads[index].schema;
            let fields = &decoded[at..at + schema.record.fields.len()];
            at += fields.len();
            facts.push(Fact::new(schema, fields)?);
        }
        let run_facts: Vec<(&Fact, rows::Stripped)> = facts
            .iter()
            .zip(members)
            .map(|(fact, &index)| {
                let raw = batch.values[index];
                let stripped = rows::Stripped {
                    header: &raw[..HEADER_LEN],
                    body: &raw[batch.heads[index].after_run_id..],
                };
                (fact, stripped)
            })
            .collect();
        let before = match carried.remove(*run_id) {
            Some(state) => Some(state),
            None => stored.remove(run_id).flatten(),
        };
        let was_new = before.is_none();
        let old_due = rows::due_entries(before.as_ref());
        let new = reduce::journal_facts(&run_facts, before.as_ref());
        if let Some((first, _)) = new.first() {
            let seq = rows::u64_bytes(first.seq)?;
            rows.history_keys.push(rows::history_key(run_id, &seq));
            rows.history_chunks.push(rows::history_chunk(&new));
        }
        let new_facts: Vec<&Fact> = new.iter().map(|(fact, _)| *fact).collect();
        let (after, changed) = reduce::fold(&new_facts, before)?;
        if let (Some(state), true) = (&after, changed) {
            rows.run_keys.push(rows::string_key_of(run_id));
            json.clear();
            json::write_run(state, json);
            rows.run_values.push(json.clone());
            let new_due = rows::due_entries(Some(state));
            for entry in old_due.difference(&new_due) {
                rows.due_deletes.push(rows::due_key(entry)?);
            }
            for entry in new_due.difference(&old_due) {
                rows.due_puts.push(rows::due_key(entry)?);
            }
            if let (Some(key), true) = (&state.idempotency_key, was_new) {
                rows.claim_keys.push(rows::string_key_of(key));
                let fingerprint = state.fingerprint.as_deref();
                rows.claim_values
                    .push(rows::claim_value(&state.run_id, fingerprint));
            }
        }
        if let Some(state) = after {
            rows.started += usize::from(was_new);
            folded.insert(run_id.to_string(), state);
        }
    }
    *carried = folded;
    Ok(rows)
}

/// The schema of an encoded fact, its run id (the first field of every fact) and where
/// its body goes on after the run id.
fn head<'s, 'a>(
    schemas: &'s Schemas,
    raw: &'a [u8],
) -> Result<(&'s FactSchema, &'a str, usize), String> {
    if raw.len() < HEADER_LEN || raw[..2] != MAGIC {
        return Err("not an Avro single-object value".into());
    }
    let fingerprint: [u8; 8] = raw[2..HEADER_LEN].try_into().map_err(|_| "header")?;
    let schema = schemas
        .get(&fingerprint)
        .ok_or("fingerprint not folded here")?;
    let (run_id, after_run_id) = avro::leading_string(raw, HEADER_LEN)?;
    Ok((schema, run_id, after_run_id))
}

/// Value indexes grouped by run, each run's in log order (a counting sort of ``runs``,
/// the run of each value): ``order[starts[r]..starts[r + 1]]`` are run ``r``'s.
fn by_run(runs: impl Iterator<Item = usize> + Clone, count: usize) -> (Vec<usize>, Vec<usize>) {
    let mut starts = vec![0; count + 1];
    for run in runs.clone() {
        starts[run + 1] += 1;
    }
    for run in 0..count {
        starts[run + 1] += starts[run];
    }
    let mut next = starts.clone();
    let mut order = vec![0; starts[count]];
    for (index, run) in runs.enumerate() {
        order[next[run]] = index;
        next[run] += 1;
    }
    (starts, order)
}

#[pymodule]
fn processor_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Kernel>()?;
    Ok(())
}
