//! Avro binary decoding of the fact schemas: records of primitive fields, optional
//! (null-union) fields and arrays of ints. Anything else is not handled here, and a
//! value that does not decode exactly (truncated, trailing bytes, bad UTF-8) is an
//! error: the caller then leaves the batch to the Python codec, which decides.

use serde_json::Value as Json;

/// A field type that is not a union.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plain {
    Str,
    Long,
    Bytes,
    Bool,
    Longs,
}

/// A field's type: a plain type, or a union of null (branch ``null_branch``) and a
/// plain type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldType {
    pub plain: Plain,
    pub null_branch: Option<u8>,
}

/// A decoded field; strings and bytes borrow from the encoded value, and so does an
/// array of numbers (checked when decoded, read with ``longs`` when wanted: most facts
/// have none, and a value that owns nothing needs no dropping).
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    Null,
    Str(&'a str),
    Long(i64),
    Bytes(&'a [u8]),
    Bool(bool),
    /// An encoded array of numbers.
    Longs(&'a [u8]),
}

#[derive(Clone, Debug)]
pub struct RecordSchema {
    /// The record's name without its namespace.
    pub name: String,
    pub fields: Vec<(String, FieldType)>,
}

pub type Error = String;

impl RecordSchema {
    /// The schema of a declared record (its ``.avsc`` JSON), if every field is handled here.
    pub fn parse(declared: &Json) -> Result<RecordSchema, Error> {
        if declared.get("type").and_then(Json::as_str) != Some("record") {
            return Err("not a record".into());
        }
        let full_name = declared
            .get("name")
            .and_then(Json::as_str)
            .ok_or("record without a name")?;
        let name = full_name
            .rsplit('.')
            .next()
            .unwrap_or(full_name)
            .to_string();
        let mut fields = Vec::new();
        for field in declared
            .get("fields")
            .and_then(Json::as_array)
            .ok_or("no fields")?
        {
            let field_name = field
                .get("name")
                .and_then(Json::as_str)
                .ok_or("unnamed field")?;
            let field_type = parse_type(field.get("type").ok_or("field without a type")?)?;
            fields.push((field_name.to_string(), field_type));
        }
        Ok(RecordSchema { name, fields })
    }

    /// Decode a record body from field ``first`` on (the caller read the fields
    /// before it), ``raw[start..]``: all of it and nothing more, appending the field
    /// values to ``out``.
    pub fn decode_from<'a>(
        &self,
        raw: &'a [u8],
        start: usize,
        first: usize,
        out: &mut Vec<Value<'a>>,
    ) -> Result<(), Error> {
        let mut input = Input { raw, pos: start };
        for (_, field_type) in &self.fields[first..] {
            out.push(input.field(*field_type)?);
        }
        if input.pos != raw.len() {
            return Err("trailing bytes after the Avro body".into());
        }
        Ok(())
    }
}

/// The string that begins the record body ``raw[start..]`` (a record whose first field
/// is a string), and where the body goes on after it, without decoding the rest.
pub fn leading_string(raw: &[u8], start: usize) -> Result<(&str, usize), Error> {
    let mut input = Input { raw, pos: start };
    let text = input.string()?;
    Ok((text, input.pos))
}

fn parse_type(declared: &Json) -> Result<FieldType, Error> {
    if let Json::Array(branches) = declared {
        let [first, second] = branches.as_slice() else {
            return Err("a union of other than two branches".into());
        };
        let null_branch = match (first.as_str(), second.as_str()) {
            (Some("null"), _) => 0,
            (_, Some("null")) => 1,
            _ => return Err("a union without null".into()),
        };
        let other = if null_branch == 0 { second } else { first };
        if other.is_array() {
            return Err("nested union".into());
        }
        return Ok(FieldType {
            plain: parse_plain(other)?,
            null_branch: Some(null_branch),
        });
    }
    Ok(FieldType {
        plain: parse_plain(declared)?,
        null_branch: None,
    })
}

fn parse_plain(declared: &Json) -> Result<Plain, Error> {
    match declared {
        Json::String(name) => match name.as_str() {
            "string" => Ok(Plain::Str),
            "long" | "int" => Ok(Plain::Long),
            "bytes" => Ok(Plain::Bytes),
            "boolean" => Ok(Plain::Bool),
            other => Err(format!("type {other} not handled")),
        },
        Json::Object(spec) => match spec.get("type").and_then(Json::as_str) {
            Some("array") => match spec.get("items").and_then(Json::as_str) {
                Some("int") | Some("long") => Ok(Plain::Longs),
                _ => Err("array items not handled".into()),
            },
            Some(simple @ ("string" | "long" | "int" | "bytes" | "boolean")) => {
                if spec.contains_key("logicalType") {
                    return Err("logical type not handled".into());
                }
                parse_plain(&Json::String(simple.to_string()))
            }
            _ => Err("complex type not handled".into()),
        },
        _ => Err("type not handled".into()),
    }
}

/// Errors inside the decoder are static text; ``decode_from`` makes them ``Error``.
type Fault = &'static str;

struct Input<'a> {
    raw: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    #[inline]
    fn field(&mut self, field_type: FieldType) -> Result<Value<'a>, Fault> {
        if let Some(null_branch) = field_type.null_branch {
            // A union's branch index is a zigzag long: 0 is the byte 0, 1 the byte 2.
            let branch = match self.byte()? {
                0 => 0,
                2 => 1,
                _ => return Err("union branch out of range"),
            };
            if branch == null_branch {
                return Ok(Value::Null);
            }
        }
        self.plain(field_type.plain)
    }

    #[inline]
    fn plain(&mut self, plain: Plain) -> Result<Value<'a>, Fault> {
        Ok(match plain {
            Plain::Str => Value::Str(self.string()?),
            Plain::Long => Value::Long(self.long()?),
            Plain::Bytes => Value::Bytes(self.bytes()?),
            Plain::Bool => match self.byte()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                _ => return Err("boolean byte not 0 or 1"),
            },
            Plain::Longs => {
                let start = self.pos;
                self.longs(|_| ())?;
                Value::Longs(&self.raw[start..self.pos])
            }
        })
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, Fault> {
        let byte = *self.raw.get(self.pos).ok_or("truncated")?;
        self.pos += 1;
        Ok(byte)
    }

    /// A zigzag varint; most are one byte (small numbers, lengths under 64).
    #[inline]
    fn long(&mut self) -> Result<i64, Fault> {
        match self.raw.get(self.pos) {
            Some(&byte) if byte < 0x80 => {
                self.pos += 1;
                Ok(zigzag(u64::from(byte)))
            }
            _ => self.long_multibyte(),
        }
    }

    #[cold]
    fn long_multibyte(&mut self) -> Result<i64, Fault> {
        let mut result: u64 = 0;
        let mut shift = 0;
        loop {
            let byte = self.byte()?;
            if shift >= 64 {
                return Err("varint too long");
            }
            result |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(zigzag(result));
            }
            shift += 7;
        }
    }

    #[inline]
    fn bytes(&mut self) -> Result<&'a [u8], Fault> {
        let length = usize::try_from(self.long()?).map_err(|_| "negative length")?;
        // ``pos`` is within ``raw`` and ``length`` below 2^63: the sum cannot overflow.
        let end = self.pos + length;
        let slice = self.raw.get(self.pos..end).ok_or("truncated")?;
        self.pos = end;
        Ok(slice)
    }

    #[inline]
    fn string(&mut self) -> Result<&'a str, Fault> {
        utf8(self.bytes()?)
    }

    /// An array of numbers, each given to ``item``.
    fn longs(&mut self, mut item: impl FnMut(i64)) -> Result<(), Fault> {
        loop {
            let count = self.long()?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                self.long()?; // a negative count is followed by the block's size
            }
            for _ in 0..count.unsigned_abs() {
                item(self.long()?);
            }
        }
    }
}

/// The numbers of an encoded array that decoded as ``Value::Longs``.
pub fn longs(encoded: &[u8]) -> Result<Vec<i64>, Error> {
    let mut items = Vec::new();
    Input {
        raw: encoded,
        pos: 0,
    }
    .longs(|number| items.push(number))?;
    Ok(items)
}

/// The items of an encoded array of bytes (``{"type": "array", "items": "bytes"}``)
/// that ends where ``encoded`` ends: a fact batch's facts, in order.
pub fn byte_items(encoded: &[u8]) -> Result<Vec<&[u8]>, Error> {
    let mut input = Input {
        raw: encoded,
        pos: 0,
    };
    let mut items = Vec::new();
    loop {
        let count = input.long()?;
        if count == 0 {
            break;
        }
        if count < 0 {
            input.long()?; // a negative count is followed by the block's size
        }
        for _ in 0..count.unsigned_abs() {
            items.push(input.bytes()?);
        }
    }
    if input.pos != encoded.len() {
        return Err("bytes after the array's end".into());
    }
    Ok(items)
}

fn zigzag(encoded: u64) -> i64 {
    (encoded >> 1) as i64 ^ -((encoded & 1) as i64)
}

/// ``bytes`` as text if they are UTF-8. Fact strings are nearly always ASCII (ids,
/// keys, names), which a word-at-a-time check settles in a fraction of what full
/// validation of a short string costs.
#[inline]
fn utf8(bytes: &[u8]) -> Result<&str, Fault> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is valid UTF-8.
        return Ok(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes).map_err(|_| "string not UTF-8")
}
