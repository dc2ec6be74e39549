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

use std::sync::Arc;

use indexmap::IndexMap;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use rustc_hash::{FxBuildHasher, FxHashMap};

use avro::RecordSchema;
use reduce::{Fact, Schemas, FOLDED, HEADER};
use state::RunState;

const MAGIC: [u8; 2] = [0xC3, 0x01];
const HEADER_LEN: usize = 10;

/// The rows of one batch; history chunks and run JSON are built straight into the
/// Python bytes the WriteBatch's ``put`` takes.
#[derive(Default)]
struct Rows<'py> {
    history_keys: Vec<Vec<u8>>,
    history_chunks: Vec<Bound<'py, PyBytes>>,
    run_keys: Vec<Vec<u8>>,
    run_values: Vec<Bound<'py, PyBytes>>,
    due_puts: Vec<Vec<u8>>,
    due_deletes: Vec<Vec<u8>>,
    claim_keys: Vec<Vec<u8>>,
    claim_values: Vec<Vec<u8>>,
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
            if !FOLDED.contains(&schema.name.as_str()) {
                return Err(PyValueError::new_err(format!(
                    "{} is not folded here",
                    schema.name
                )));
            }
            let names = schema.fields.iter().map(|(name, _)| name.as_str());
            if !names.take(HEADER.len()).eq(HEADER) {
                return Err(PyValueError::new_err(format!(
                    "{} lacks the fact header",
                    schema.name
                )));
            }
            parsed.insert(fingerprint, Arc::new(schema));
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
    /// and ``delete(key, family)`` (a WriteBatch's methods); ``families`` are the
    /// history, runs, due and claims column families. ``load(run_ids)``
    /// answers the stored JSON (or None) of runs not carried. Raises ValueError before
    /// writing anything, and forgets the carried runs, for any value or stored run not
    /// handled exactly here.
    fn fold_into(
        &mut self,
        py: Python<'_>,
        values: &Bound<'_, PyList>,
        load: &Bound<'_, PyAny>,
        put: &Bound<'_, PyAny>,
        delete: &Bound<'_, PyAny>,
        families: [PyObject; 4],
    ) -> PyResult<()> {
        let raws: Vec<Bound<'_, PyBytes>> = values
            .iter()
            .map(|value| value.downcast_into::<PyBytes>().map_err(PyErr::from))
            .collect::<PyResult<_>>()?;
        let slices: Vec<&[u8]> = raws.iter().map(|raw| raw.as_bytes()).collect();
        let result = self.fold(&slices, load);
        if result.is_err() {
            self.carried.clear();
        }
        let rows = result?;
        let [history, runs, due, claims] = families;
        let bytes = |data: &[u8]| PyBytes::new(py, data);
        for (key, chunk) in rows.history_keys.iter().zip(&rows.history_chunks) {
            put.call1((bytes(key), chunk, &history))?;
        }
        for (key, value) in rows.run_keys.iter().zip(&rows.run_values) {
            put.call1((bytes(key), value, &runs))?;
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
        Ok(())
    }
}

impl Kernel {
    fn decode<'a>(&self, raw: &'a [u8]) -> Result<Fact<'a>, String> {
        if raw.len() < HEADER_LEN || raw[..2] != MAGIC {
            return Err("not an Avro single-object value".into());
        }
        let fingerprint: [u8; 8] = raw[2..HEADER_LEN].try_into().map_err(|_| "header")?;
        let schema = self
            .schemas
            .get(&fingerprint)
            .ok_or("fingerprint not folded here")?;
        let values = schema.decode(raw, HEADER_LEN)?;
        Fact::new(Arc::clone(schema), values)
    }

    fn fold<'py>(&mut self, values: &[&[u8]], load: &Bound<'py, PyAny>) -> PyResult<Rows<'py>> {
        let py = load.py();
        let invalid = |e: String| PyValueError::new_err(e);
        // Decode everything first: a value not handled here stages nothing.
        let facts = values
            .iter()
            .map(|raw| self.decode(raw))
            .collect::<Result<Vec<_>, _>>();
        let facts = facts.map_err(invalid)?;
        let mut by_run: IndexMap<&str, Vec<(&Fact, &[u8])>, FxBuildHasher> = IndexMap::default();
        for (fact, raw) in facts.iter().zip(values) {
            by_run.entry(fact.run_id).or_default().push((fact, raw));
        }
        let missing: Vec<&str> = by_run
            .keys()
            .copied()
            .filter(|run_id| !self.carried.contains_key(*run_id))
            .collect();
        let mut stored: FxHashMap<&str, Option<RunState>> = FxHashMap::default();
        if !missing.is_empty() {
            let answered: Vec<Option<Vec<u8>>> = load.call1((missing.clone(),))?.extract()?;
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
        let mut rows = Rows::default();
        let mut carried = FxHashMap::default();
        carried.reserve(by_run.len());
        for (run_id, run_facts) in &by_run {
            let before = match self.carried.remove(*run_id) {
                Some(state) => Some(state),
                None => stored.remove(run_id).flatten(),
            };
            let was_new = before.is_none();
            let old_due = rows::due_entries(before.as_ref());
            let new = reduce::journal_facts(run_facts, before.as_ref());
            if let Some((first, _)) = new.first() {
                let seq = rows::u64_bytes(first.seq).map_err(invalid)?;
                rows.history_keys.push(rows::history_key(run_id, &seq));
                let chunk = PyBytes::new_with(py, rows::history_chunk_len(&new), |out| {
                    rows::write_history_chunk(&new, out);
                    Ok(())
                })?;
                rows.history_chunks.push(chunk);
            }
            let new_facts: Vec<&Fact> = new.iter().map(|(fact, _)| *fact).collect();
            let (after, changed) = reduce::fold(&new_facts, before).map_err(invalid)?;
            if let (Some(state), true) = (&after, changed) {
                rows.run_keys.push(rows::string_key_of(run_id));
                self.json.clear();
                json::write_run(state, &mut self.json);
                rows.run_values.push(PyBytes::new(py, &self.json));
                let new_due = rows::due_entries(Some(state));
                for entry in old_due.difference(&new_due) {
                    rows.due_deletes
                        .push(rows::due_key(entry).map_err(invalid)?);
                }
                for entry in new_due.difference(&old_due) {
                    rows.due_puts.push(rows::due_key(entry).map_err(invalid)?);
                }
                if let (Some(key), true) = (&state.idempotency_key, was_new) {
                    rows.claim_keys.push(rows::string_key_of(key));
                    let fingerprint = state.fingerprint.as_deref();
                    rows.claim_values
                        .push(rows::claim_value(&state.run_id, fingerprint));
                }
            }
            if let Some(state) = after {
                carried.insert(run_id.to_string(), state);
            }
        }
        self.carried = carried;
        Ok(rows)
    }
}

#[pymodule]
fn processor_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Kernel>()?;
    Ok(())
}
