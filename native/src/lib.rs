//! ``processor_native``: the replay fold compiled. ``Kernel.fold_into`` turns a batch
//! of encoded facts into the rows ``Staging.fold_read`` + ``flush`` would write and
//! puts them into a WriteBatch, or raises ``ValueError`` (before putting anything) for
//! whatever it does not handle exactly: the caller then folds that batch in Python,
//! the reference (``processor/store/native_fold.py``).

mod avro;
mod json;
mod reduce;
mod rows;
mod seen;
mod state;

use indexmap::IndexMap;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use rustc_hash::{FxBuildHasher, FxHashMap};
use std::ops::Range;

use avro::{FieldType, Plain, RecordSchema, Value};
use reduce::{Fact, FactSchema, Kind, Schemas, HEADER};
use seen::Seen;
use state::RunState;

/// The fold allocates and frees a run's strings and bytes by the thousand per batch;
/// mimalloc does that in about three quarters of the time glibc's malloc takes (all of
/// it inside the extension: nothing allocated here is freed by Python, or the reverse).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MAGIC: [u8; 2] = [0xC3, 0x01];
const HEADER_LEN: usize = 10;

/// The column family of a row, as ``fold_into``'s ``families`` give them.
#[derive(Clone, Copy)]
enum Family {
    History = 0,
    Runs = 1,
    Due = 2,
    Index = 3,
}

/// The column families ``fold_into`` takes, in order (``native_fold._FAMILIES``): the
/// Python side uses a build only if it declares the families it expects.
const FAMILIES: [&str; 4] = ["history", "runs", "due", "index"];

/// One row to write: its key and value are ranges of ``Rows::bytes``.
struct Row {
    family: Family,
    key: Range<usize>,
    /// None: delete the key.
    value: Option<Range<usize>>,
}

/// The rows of one batch, their bytes in one buffer that is kept, with its capacity,
/// from batch to batch (a batch writes tens of megabytes; allocating them anew each
/// time cost page faults).
#[derive(Default)]
struct Rows {
    bytes: Vec<u8>,
    rows: Vec<Row>,
    /// Runs that began in this batch (were in neither the carry nor the store).
    started: usize,
}

impl Rows {
    fn clear(&mut self) {
        self.bytes.clear();
        self.rows.clear();
        self.started = 0;
    }

    /// A row of the key and the value ``key`` and ``value`` write.
    fn put(
        &mut self,
        family: Family,
        key: impl FnOnce(&mut Vec<u8>) -> Result<(), String>,
        value: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), String> {
        let key = self.key(key)?;
        let start = self.bytes.len();
        value(&mut self.bytes);
        let value = Some(start..self.bytes.len());
        self.rows.push(Row { family, key, value });
        Ok(())
    }

    /// A delete of the key ``key`` writes.
    fn delete(
        &mut self,
        family: Family,
        key: impl FnOnce(&mut Vec<u8>) -> Result<(), String>,
    ) -> Result<(), String> {
        let key = self.key(key)?;
        self.rows.push(Row {
            family,
            key,
            value: None,
        });
        Ok(())
    }

    fn key(
        &mut self,
        key: impl FnOnce(&mut Vec<u8>) -> Result<(), String>,
    ) -> Result<Range<usize>, String> {
        let start = self.bytes.len();
        key(&mut self.bytes)?;
        Ok(start..self.bytes.len())
    }
}

/// Folds batches of one partition's facts, in log order, carrying the runs of each
/// batch to the next (as ``Staging(carry=True)`` does).
#[pyclass]
struct Kernel {
    schemas: Schemas,
    carried: FxHashMap<String, Box<RunState>>,
    /// The rows of the batch being folded (kept for the next batch's).
    rows: Rows,
    /// The allocation of a batch's decoded facts, empty between batches, kept with its
    /// capacity for the next batch (a fresh one of this size costs page faults).
    decoded: Vec<Value<'static>>,
    /// The runs written since the store was empty (None: it was not, or it was
    /// written by someone else since): the others need no lookup.
    seen: Option<Seen>,
}

/// An empty Vec of ``U`` in the allocation of ``buffer`` (left empty) when ``T`` and
/// ``U`` have the same layout, as a value type and the same type borrowing for another
/// lifetime do: the standard library collects a mapped ``IntoIter`` in place.
fn reuse<T, U>(buffer: &mut Vec<T>) -> Vec<U> {
    let mut taken = std::mem::take(buffer);
    taken.clear();
    taken
        .into_iter()
        .map(|_| unreachable!("the vector is empty"))
        .collect()
}

#[pymethods]
impl Kernel {
    /// ``schemas``: (8-byte fingerprint, declared schema JSON) of each current fact schema.
    /// ``empty_store``: the store holds no run yet (so a run this kernel has not
    /// written is new, with no lookup), until ``reset``.
    #[new]
    #[pyo3(signature = (schemas, empty_store = false))]
    fn new(schemas: Vec<(Vec<u8>, String)>, empty_store: bool) -> PyResult<Self> {
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
            rows: Rows::default(),
            decoded: Vec::new(),
            seen: empty_store.then(Seen::new),
        })
    }

    /// Forget the carried runs (after a batch folded elsewhere changed the store).
    fn reset(&mut self) {
        self.carried.clear();
        self.seen = None;
    }

    /// Fold a batch of encoded facts (None values, which are no facts, left out) and
    /// put its rows with ``put(key, value, family)`` and ``delete(key, family)`` (a
    /// WriteBatch's methods); return how many runs began in it. ``families`` are the
    /// history, runs, due and index column families (``FAMILIES``). ``load(run_keys)`` answers the
    /// stored JSON (or None) of the runs not carried, by their keys. Raises ValueError
    /// before writing anything, and forgets the carried runs, for any value or stored
    /// run not handled exactly here.
    fn fold_into(
        &mut self,
        py: Python<'_>,
        values: &Bound<'_, PyList>,
        load: &Bound<'_, PyAny>,
        put: &Bound<'_, PyAny>,
        delete: &Bound<'_, PyAny>,
        families: [PyObject; 4],
    ) -> PyResult<usize> {
        // A record without a value (None) is no fact: it is left out, as the Python fold does.
        let raws: Vec<Bound<'_, PyBytes>> = values
            .iter()
            .filter(|value| !value.is_none())
            .map(|value| value.downcast_into::<PyBytes>().map_err(PyErr::from))
            .collect::<PyResult<_>>()?;
        let slices: Vec<&[u8]> = raws.iter().map(|raw| raw.as_bytes()).collect();
        let result = self.fold(py, &slices, load);
        if result.is_err() {
            self.carried.clear();
        }
        result?;
        let rows = &self.rows;
        let empty = PyBytes::new(py, b"");
        for row in &rows.rows {
            let family = &families[row.family as usize];
            let key = PyBytes::new(py, &rows.bytes[row.key.clone()]);
            match &row.value {
                Some(value) if value.is_empty() => put.call1((key, &empty, family))?,
                Some(value) => {
                    let value = PyBytes::new(py, &rows.bytes[value.clone()]);
                    put.call1((key, value, family))?
                }
                None => delete.call1((key, family))?,
            };
        }
        Ok(rows.started)
    }
}

impl Kernel {
    /// Group the batch by run and load the runs not carried (with the GIL), then fold
    /// every run without it (``fold_runs`` touches no Python object), so other threads
    /// of the process run meanwhile: the catch-up pool's feeder, the processor's own.
    fn fold(&mut self, py: Python<'_>, values: &[&[u8]], load: &Bound<'_, PyAny>) -> PyResult<()> {
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
        let seen = self.seen.as_ref();
        let missing: Vec<&str> = runs
            .keys()
            .copied()
            .filter(|run_id| !self.carried.contains_key(*run_id))
            .filter(|run_id| seen.is_none_or(|seen| seen.may_contain(run_id)))
            .collect();
        let mut stored: FxHashMap<&str, Option<Box<RunState>>> = FxHashMap::default();
        stored.reserve(missing.len());
        if !missing.is_empty() {
            let mut key = Vec::new();
            let keys = missing.iter().map(|run_id| {
                key.clear();
                rows::string_key(run_id, &mut key);
                PyBytes::new(py, &key)
            });
            let answered: Vec<Option<Vec<u8>>> =
                load.call1((PyList::new(py, keys)?,))?.extract()?;
            if answered.len() != missing.len() {
                return Err(invalid("load answered a different number of runs".into()));
            }
            for (run_id, raw) in missing.iter().zip(answered) {
                let state = raw
                    .map(|raw| RunState::from_json(&raw).map(Box::new))
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
        let (carried, rows, decoded) = (&mut self.carried, &mut self.rows, &mut self.decoded);
        rows.clear();
        py.allow_threads(|| fold_runs(&batch, carried, stored, rows, decoded))
            .map_err(invalid)?;
        if let Some(seen) = self.seen.as_mut() {
            runs.keys().for_each(|run_id| seen.insert(run_id));
        }
        Ok(())
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
/// run not in the store) and write the rows that changes into ``rows``; ``carried``
/// becomes this batch's runs.
fn fold_runs<'a>(
    batch: &Batch<'_, 'a>,
    carried: &mut FxHashMap<String, Box<RunState>>,
    mut stored: FxHashMap<&'a str, Option<Box<RunState>>>,
    rows: &mut Rows,
    spare_decoded: &mut Vec<Value<'static>>,
) -> Result<(), String> {
    let (starts, order) = by_run(batch.heads.iter().map(|head| head.run), batch.runs.len());
    // Every fact, decoded, in run order (the run id was read by the header pass: each
    // body is decoded from what follows it).
    let mut decoded: Vec<Value> = reuse(spare_decoded);
    decoded.reserve(
        batch
            .heads
            .iter()
            .map(|head| head.schema.record.fields.len())
            .sum(),
    );
    for (run, run_id) in batch.runs.keys().enumerate() {
        for &index in &order[starts[run]..starts[run + 1]] {
            let head = &batch.heads[index];
            decoded.push(Value::Str(run_id));
            head.schema.record.decode_from(
                batch.values[index],
                head.after_run_id,
                1,
                &mut decoded,
            )?;
        }
    }
    let mut facts = Vec::with_capacity(order.len());
    let mut at = 0;
    for &index in &order {
        let schema = batch.heads[index].schema;
        let fields = &decoded[at..at + schema.record.fields.len()];
        at += fields.len();
        facts.push(Fact::new(schema, fields)?);
    }
    let stripped = |index: usize| {
        let raw = batch.values[index];
        rows::Stripped {
            header: &raw[..HEADER_LEN],
            body: &raw[batch.heads[index].after_run_id..],
        }
    };
    let mut folded = FxHashMap::default();
    folded.reserve(batch.runs.len());
    let (mut new, mut old_due, mut new_due) = (Vec::new(), Vec::new(), Vec::new());
    let (mut old_index, mut new_index) = (rows::IndexKeys::default(), rows::IndexKeys::default());
    for (run, run_id) in batch.runs.keys().enumerate() {
        let members = &order[starts[run]..starts[run + 1]];
        let run_facts = &facts[starts[run]..starts[run + 1]];
        let (key, mut state) = match carried.remove_entry(*run_id) {
            Some((key, state)) => (key, Some(state)),
            None => (run_id.to_string(), stored.remove(run_id).flatten()),
        };
        let was_new = state.is_none();
        rows::due_entries(state.as_deref(), &mut old_due);
        rows::index_keys(state.as_deref(), &mut old_index);
        reduce::journal_facts(run_facts, state.as_deref(), &mut new);
        if let Some(&first) = new.first() {
            rows.put(
                Family::History,
                |out| rows::history_key(run_id, run_facts[first].seq, out),
                |out| rows::history_chunk(new.iter().map(|&i| stripped(members[i])), out),
            )?;
        }
        let changed = reduce::fold(new.iter().map(|&i| &run_facts[i]), &mut state)?;
        if let (Some(state), true) = (&state, changed) {
            rows.put(
                Family::Runs,
                |out| {
                    rows::string_key(run_id, out);
                    Ok(())
                },
                |out| json::write_run(state, out),
            )?;
            rows::due_entries(Some(state), &mut new_due);
            for entry in rows::due_difference(&old_due, &new_due) {
                rows.delete(Family::Due, |out| rows::due_key(run_id, entry, out))?;
            }
            for entry in rows::due_difference(&new_due, &old_due) {
                rows.put(Family::Due, |out| rows::due_key(run_id, entry, out), |_| {})?;
            }
            rows::index_keys(Some(state), &mut new_index);
            for key in old_index.difference(&new_index) {
                rows.delete(Family::Index, |out| {
                    out.extend_from_slice(key);
                    Ok(())
                })?;
            }
            for key in new_index.difference(&old_index) {
                rows.put(
                    Family::Index,
                    |out| {
                        out.extend_from_slice(key);
                        Ok(())
                    },
                    |_| {},
                )?;
            }
        }
        if let Some(state) = state {
            rows.started += usize::from(was_new);
            folded.insert(key, state);
        }
    }
    *carried = folded;
    drop(facts);
    *spare_decoded = reuse(&mut decoded);
    Ok(())
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

/// ``values`` with each fact batch in it (a value that begins with ``header``, the
/// single-object header of ``FactBatch``) replaced by the facts it holds, in order;
/// None when it holds none. Raises ``ValueError`` for a batch that does not decode
/// (the caller's Python path then says why). ``transport/fact_batches.py`` calls it
/// for every batch restore and replay read: a scan of the values in Rust, where the
/// same in Python cost more than the fold's own work on a journal of batches.
#[pyfunction]
fn expand_fact_batches<'py>(
    values: &Bound<'py, PyList>,
    header: &[u8],
) -> PyResult<Option<Bound<'py, PyList>>> {
    let batch_of = |item: &Bound<'py, PyAny>| -> Option<Bound<'py, PyBytes>> {
        let value = item.downcast::<PyBytes>().ok()?;
        value.as_bytes().starts_with(header).then(|| value.clone())
    };
    let Some(first) = values.iter().position(|item| batch_of(&item).is_some()) else {
        return Ok(None);
    };
    let py = values.py();
    let out = PyList::empty(py);
    for (index, item) in values.iter().enumerate() {
        let batch = if index < first { None } else { batch_of(&item) };
        let Some(batch) = batch else {
            out.append(item)?;
            continue;
        };
        let facts =
            avro::byte_items(&batch.as_bytes()[header.len()..]).map_err(PyValueError::new_err)?;
        for fact in facts {
            out.append(PyBytes::new(py, fact))?;
        }
    }
    Ok(Some(out))
}

#[pymodule]
fn processor_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Kernel>()?;
    module.add_function(wrap_pyfunction!(expand_fact_batches, module)?)?;
    module.add("FAMILIES", FAMILIES)?;
    module.add("ROW_FIELDS", state::ROW_FIELDS)?;
    Ok(())
}
