//! The `.npy` format (numpy's NEP 1, versions 1.0, 2.0 and 3.0) read from bytes
//! already in memory, verified before anything is allocated: the header (a Python
//! dict literal) is parsed here rather than trusted to a library, the element count
//! is computed with checked arithmetic, and count × item size must equal the bytes
//! after the header exactly. Also the writer FDO statistics files use.

use super::{Problem, Values};

const MAGIC: &[u8] = b"\x93NUMPY";
/// The most dimensions an array may have (numpy's own limit is 64).
const MAX_DIMS: usize = 64;
/// How deeply tuples and lists may nest in a header (a header of a million `(`
/// must not overflow the stack).
const MAX_DEPTH: usize = 8;

/// An element type numpy writes, as `descr` spells it (`<f4`, `|u1`, `>i8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dtype {
    kind: Kind,
    /// Bytes per element.
    pub size: usize,
    big_endian: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Float,
    Int,
    Uint,
    Bool,
}

impl Dtype {
    /// The types shardc reads: floats of 2, 4 and 8 bytes, integers of 1 to 8
    /// bytes, and booleans, in either byte order.
    pub fn parse(descr: &str) -> Option<Dtype> {
        let mut chars = descr.chars();
        let order = chars.next()?;
        let big_endian = match order {
            '<' | '|' => false,
            '>' => true,
            '=' => cfg!(target_endian = "big"),
            _ => return None,
        };
        let kind = match chars.next()? {
            'f' => Kind::Float,
            'i' => Kind::Int,
            'u' => Kind::Uint,
            'b' => Kind::Bool,
            _ => return None,
        };
        let size: usize = chars.as_str().parse().ok()?;
        let ok = match kind {
            Kind::Float => matches!(size, 2 | 4 | 8),
            Kind::Int | Kind::Uint => matches!(size, 1 | 2 | 4 | 8),
            Kind::Bool => size == 1,
        };
        ok.then_some(Dtype {
            kind,
            size,
            big_endian,
        })
    }

    /// The type's numpy name, for messages.
    pub fn name(&self) -> &'static str {
        match (self.kind, self.size) {
            (Kind::Float, 2) => "float16",
            (Kind::Float, 4) => "float32",
            (Kind::Float, _) => "float64",
            (Kind::Int, 1) => "int8",
            (Kind::Int, 2) => "int16",
            (Kind::Int, 4) => "int32",
            (Kind::Int, _) => "int64",
            (Kind::Uint, 1) => "uint8",
            (Kind::Uint, 2) => "uint16",
            (Kind::Uint, 4) => "uint32",
            (Kind::Uint, _) => "uint64",
            (Kind::Bool, _) => "bool",
        }
    }

    /// Stored as an integer (or boolean) type.
    pub fn is_int(&self) -> bool {
        self.kind != Kind::Float
    }

    /// One element's bytes as a little-endian integer; `c` holds exactly
    /// `size` bytes.
    fn bits(&self, c: &[u8]) -> u64 {
        let mut b = [0u8; 8];
        for (d, s) in b.iter_mut().zip(c) {
            *d = *s;
        }
        if self.big_endian {
            b[..self.size.min(8)].reverse();
        }
        u64::from_le_bytes(b)
    }

    /// One integer element (`None` for a float type): a token id. `c`
    /// holds exactly `size` bytes; a uint64 past `i64::MAX` saturates.
    pub fn integer(&self, c: &[u8]) -> Option<i64> {
        let u = self.bits(c);
        match (self.kind, self.size) {
            (Kind::Float, _) => None,
            (Kind::Int, 1) => Some(i64::from(u as u8 as i8)),
            (Kind::Int, 2) => Some(i64::from(u as u16 as i16)),
            (Kind::Int, 4) => Some(i64::from(u as u32 as i32)),
            (Kind::Int, _) => Some(u as i64),
            (Kind::Uint, _) => Some(i64::try_from(u).unwrap_or(i64::MAX)),
            (Kind::Bool, _) => Some(i64::from(u != 0)),
        }
    }

    /// One element's value; `c` holds exactly `size` bytes.
    fn value(&self, c: &[u8]) -> f64 {
        let u = self.bits(c);
        match (self.kind, self.size) {
            (Kind::Float, 2) => f16_to_f64(u as u16),
            (Kind::Float, 4) => f64::from(f32::from_bits(u as u32)),
            (Kind::Float, _) => f64::from_bits(u),
            (Kind::Int, 1) => f64::from(u as u8 as i8),
            (Kind::Int, 2) => f64::from(u as u16 as i16),
            (Kind::Int, 4) => f64::from(u as u32 as i32),
            (Kind::Int, _) => u as i64 as f64,
            (Kind::Uint, _) => u as f64,
            (Kind::Bool, _) => f64::from(u8::from(u != 0)),
        }
    }
}

/// IEEE half precision to f64 (exact).
fn f16_to_f64(h: u16) -> f64 {
    let sign = if h >> 15 == 1 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    match exp {
        0 => sign * frac * 2f64.powi(-24),
        31 if frac == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        e => sign * (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// A verified `.npy`: its header, and data of exactly the size it declares.
#[derive(Debug)]
pub struct Npy<'a> {
    pub dtype: Dtype,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
    pub data: &'a [u8],
}

/// Parse and verify a `.npy` file's bytes. Nothing is allocated by the size the
/// header declares: the data must already be there, byte for byte.
pub fn parse(bytes: &[u8]) -> Result<Npy<'_>, Problem> {
    let (head, start) = header(bytes)?;
    let data = &bytes[start..];
    verify_size(
        &head.shape,
        head.dtype.size,
        head.dtype.name(),
        data.len() as u64,
    )?;
    Ok(Npy {
        dtype: head.dtype,
        fortran_order: head.fortran_order,
        shape: head.shape,
        data,
    })
}

/// A `.npy` header: the array's dtype, order and shape.
#[derive(Clone, Debug)]
pub struct Head {
    pub dtype: Dtype,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
}

/// The header of a `.npy` file from its first bytes (at least the whole
/// header), and where the data starts; for files read in pieces. The caller
/// checks the data's size with [`verify_size`].
pub fn header(bytes: &[u8]) -> Result<(Head, usize), Problem> {
    let not = |why: String| Err(Problem::NotNpy(why));
    if bytes.len() < 10 || !bytes.starts_with(MAGIC) {
        return not("it does not start with numpy's `\\x93NUMPY` magic".into());
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len_bytes, utf8) = match (major, minor) {
        (1, 0) => (2, false),
        (2, 0) => (4, false),
        (3, 0) => (4, true),
        _ => {
            return not(format!(
                "format version {major}.{minor}; shardc reads 1.0, 2.0 and 3.0"
            ))
        }
    };
    let Some(len_field) = bytes.get(8..8 + len_bytes) else {
        return not("it ends inside its header".into());
    };
    let mut n = [0u8; 4];
    n[..len_bytes].copy_from_slice(len_field);
    let header_len = u32::from_le_bytes(n) as usize;
    let start = 8 + len_bytes;
    let Some(text) = start
        .checked_add(header_len)
        .and_then(|end| bytes.get(start..end))
    else {
        return not(format!(
            "its header declares {header_len} bytes, but the file holds {} after the prefix",
            bytes.len() - start
        ));
    };
    let text = match std::str::from_utf8(text) {
        Ok(t) if utf8 || t.is_ascii() => t,
        // Versions 1.0 and 2.0 are latin-1; every header numpy writes is ASCII.
        _ => return not("its header is not text".into()),
    };
    let header = Header::parse(text).map_err(Problem::NotNpy)?;
    let Some(dtype) = Dtype::parse(&header.descr) else {
        return Err(Problem::Dtype(header.descr));
    };
    Ok((
        Head {
            dtype,
            fortran_order: header.fortran_order,
            shape: header.shape,
        },
        start + header_len,
    ))
}

/// `shape` of `itemsize`-byte elements must take exactly `holds` bytes (checked
/// arithmetic), and an empty array's other dimensions must not multiply past
/// what a file may hold (later arithmetic on its shape must not overflow).
pub fn verify_size(
    shape: &[u64],
    itemsize: usize,
    dtype: &'static str,
    holds: u64,
) -> Result<(), Problem> {
    let bytes = shape
        .iter()
        .try_fold(itemsize as u128, |acc, &d| acc.checked_mul(u128::from(d)));
    if bytes != Some(u128::from(holds)) {
        return Err(Problem::SizeMismatch {
            shape: shape.to_vec(),
            dtype,
            declared: bytes,
            holds,
        });
    }
    let spread = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(itemsize as u128, |acc, &d| acc.checked_mul(u128::from(d)));
    if spread.is_none_or(|b| b > u128::from(crate::files::DATA_CAP)) {
        return Err(Problem::EmptyTooBig {
            shape: shape.to_vec(),
            dtype,
        });
    }
    Ok(())
}

/// The values in their stored type ([`Values`]), row-major (a Fortran-order
/// array is transposed into C order).
pub fn decode(npy: &Npy) -> Values {
    let size = npy.dtype.size.max(1);
    let d = npy.dtype;
    let chunks = npy.data.chunks_exact(size);
    let flat = match (d.kind, d.size) {
        (Kind::Float, 8) => Values::F64(chunks.map(|c| d.value(c)).collect()),
        // float16 and float32 are exact in f32.
        (Kind::Float, _) => Values::F32(chunks.map(|c| d.value(c) as f32).collect()),
        (Kind::Int | Kind::Uint | Kind::Bool, n) if n < 4 || (d.kind == Kind::Int && n == 4) => {
            Values::I32(chunks.map(|c| d.integer(c).unwrap_or(0) as i32).collect())
        }
        _ => Values::I64(chunks.map(|c| d.integer(c).unwrap_or(0)).collect()),
    };
    if !npy.fortran_order || npy.shape.len() < 2 {
        return flat;
    }
    // Column-major data is the row-major array of the reversed shape; walk the
    // C-order index with an odometer and take each element's Fortran offset.
    let dims: Vec<usize> = npy.shape.iter().map(|&d| d as usize).collect();
    let mut strides = vec![1usize; dims.len()];
    for k in 1..dims.len() {
        strides[k] = strides[k - 1] * dims[k - 1];
    }
    let n = flat.len();
    let mut order = Vec::with_capacity(n);
    let mut idx = vec![0usize; dims.len()];
    for _ in 0..n {
        order.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        for k in (0..dims.len()).rev() {
            idx[k] += 1;
            if idx[k] < dims[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    flat.permuted(&order)
}

/// A `.npy` file (version 1.0, C order) of `data`, already in `descr`'s layout.
pub fn write(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims = match shape {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    // numpy pads the header with spaces so the data starts on a 64-byte boundary.
    let total = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + header.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// The three keys of a `.npy` header.
#[derive(Debug, PartialEq)]
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// A Python literal of the kinds a header holds.
#[derive(Debug, PartialEq)]
enum Value {
    Str(String),
    Bool(bool),
    None,
    Int(i128),
    Seq(Vec<Value>),
}

impl Header {
    /// `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }`, padded with
    /// spaces and a newline. Exactly these three keys, as numpy requires.
    fn parse(text: &str) -> Result<Header, String> {
        let mut p = Lit {
            s: text.as_bytes(),
            i: 0,
        };
        p.expect(b'{')?;
        let (mut descr, mut fortran, mut shape) = (None, None, None);
        loop {
            p.ws();
            if p.eat(b'}') {
                break;
            }
            let Value::Str(key) = p.value(0)? else {
                return Err("its header has a key that is not a string".into());
            };
            p.expect(b':')?;
            let v = p.value(0)?;
            let slot_taken = match key.as_str() {
                "descr" => descr.replace(v).is_some(),
                "fortran_order" => fortran.replace(v).is_some(),
                "shape" => shape.replace(v).is_some(),
                other => return Err(format!("its header has the unknown key `{other}`")),
            };
            if slot_taken {
                return Err(format!("its header names `{key}` twice"));
            }
            p.ws();
            if !p.eat(b',') {
                p.expect(b'}')?;
                break;
            }
        }
        p.ws();
        if p.i != p.s.len() {
            return Err("its header has text after the dict".into());
        }
        let descr = match descr {
            Some(Value::Str(s)) => s,
            Some(_) => {
                return Err(
                    "its `descr` is a structured type; shardc reads plain arrays of numbers".into(),
                )
            }
            None => return Err("its header has no `descr`".into()),
        };
        let fortran_order = match fortran {
            Some(Value::Bool(b)) => b,
            _ => return Err("its header's `fortran_order` is not True or False".into()),
        };
        let Some(Value::Seq(dims)) = shape else {
            return Err("its header's `shape` is not a tuple".into());
        };
        if dims.len() > MAX_DIMS {
            return Err(format!(
                "its shape has {} dimensions, more than {MAX_DIMS}",
                dims.len()
            ));
        }
        let shape = dims
            .iter()
            .map(|d| match d {
                Value::Int(n) => u64::try_from(*n)
                    .map_err(|_| format!("its shape has the dimension {n}, which is not a size")),
                _ => Err("its shape holds something other than integers".to_string()),
            })
            .collect::<Result<Vec<u64>, String>>()?;
        Ok(Header {
            descr,
            fortran_order,
            shape,
        })
    }
}

/// A cursor over a header's Python literal.
struct Lit<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lit<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!(
                "its header is not a Python dict (expected `{}` at byte {})",
                c as char, self.i
            ))
        }
    }
    fn value(&mut self, depth: usize) -> Result<Value, String> {
        self.ws();
        let bad =
            |i: usize| format!("its header is not a Python dict (unexpected text at byte {i})");
        match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => {
                let start = self.i + 1;
                let len = self.s[start..]
                    .iter()
                    .position(|&c| c == q || c == b'\\')
                    .ok_or_else(|| "its header has an unterminated string".to_string())?;
                if self.s[start + len] == b'\\' {
                    return Err("its header has an escaped string".into());
                }
                self.i = start + len + 1;
                Ok(Value::Str(
                    String::from_utf8_lossy(&self.s[start..start + len]).into_owned(),
                ))
            }
            Some(&open @ (b'(' | b'[')) => {
                if depth >= MAX_DEPTH {
                    return Err("its header nests too deeply".into());
                }
                let close = if open == b'(' { b')' } else { b']' };
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    if self.eat(close) {
                        break;
                    }
                    if items.len() > MAX_DIMS {
                        return Err(format!(
                            "its header has a tuple of more than {MAX_DIMS} items"
                        ));
                    }
                    items.push(self.value(depth + 1)?);
                    if !self.eat(b',') {
                        self.expect(close)?;
                        break;
                    }
                }
                Ok(Value::Seq(items))
            }
            Some(c) if c.is_ascii_digit() || *c == b'-' => {
                let neg = *c == b'-';
                if neg {
                    self.i += 1;
                }
                let start = self.i;
                let mut n: i128 = 0;
                while let Some(d) = self.s.get(self.i).filter(|c| c.is_ascii_digit()) {
                    n = n
                        .checked_mul(10)
                        .and_then(|n| n.checked_add(i128::from(d - b'0')))
                        .ok_or_else(|| {
                            "its header has a number too large to be a size".to_string()
                        })?;
                    self.i += 1;
                }
                if self.i == start {
                    return Err(bad(start));
                }
                // Python 2 wrote long integers as `3L`.
                if matches!(self.s.get(self.i), Some(b'L' | b'l')) {
                    self.i += 1;
                }
                Ok(Value::Int(if neg { -n } else { n }))
            }
            _ => {
                for (word, v) in [
                    ("True", Value::Bool(true)),
                    ("False", Value::Bool(false)),
                    ("None", Value::None),
                ] {
                    if self.s[self.i..].starts_with(word.as_bytes()) {
                        self.i += word.len();
                        return Ok(v);
                    }
                }
                Err(bad(self.i))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_numpy_writes_parse() {
        let h = Header::parse("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }   \n")
            .expect("parse");
        assert_eq!(h.shape, vec![3, 4]);
        let h = Header::parse("{\"descr\": \"|u1\", \"fortran_order\": True, \"shape\": (5L,)}")
            .expect("parse");
        assert_eq!(
            (h.descr.as_str(), h.fortran_order, h.shape),
            ("|u1", true, vec![5])
        );
        let h =
            Header::parse("{'descr': '<i8', 'fortran_order': False, 'shape': ()}").expect("scalar");
        assert!(h.shape.is_empty());
        for bad in [
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999999999999999999999,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ((((((((((((1,),),),),),),),),),),)}",
        ] {
            assert!(Header::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fortran_order_is_transposed() {
        // [[1, 2, 3], [4, 5, 6]] stored column by column.
        let data: Vec<u8> = [1u8, 4, 2, 5, 3, 6].to_vec();
        let npy = Npy {
            dtype: Dtype::parse("|u1").expect("u1"),
            fortran_order: true,
            shape: vec![2, 3],
            data: &data,
        };
        assert_eq!(decode(&npy), Values::I32(vec![1, 2, 3, 4, 5, 6]));
    }

    #[test]
    fn half_floats_and_big_endian() {
        let h = Dtype::parse("<f2").expect("f2");
        assert_eq!(h.value(&[0x00, 0x3c]), 1.0);
        assert_eq!(h.value(&[0x00, 0xc0]), -2.0);
        assert_eq!(h.value(&[0x01, 0x00]), 2f64.powi(-24));
        let b = Dtype::parse(">i4").expect("i4");
        assert_eq!(b.value(&[0xff, 0xff, 0xff, 0xfe]), -2.0);
    }

    #[test]
    fn written_files_read_back() {
        let data: Vec<u8> = [7i32, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        let bytes = write("<i4", &[2], &data);
        assert_eq!((bytes.len() - data.len()) % 64, 0);
        let npy = parse(&bytes).expect("parse");
        assert_eq!(decode(&npy), Values::I32(vec![7, -1]));
    }
}
