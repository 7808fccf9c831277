//! How a checkpoint stores a parameter, in einops notation: `"(h e) d -> d h
//! e"` says the file holds a 2-D tensor whose rows are the parameter's `h`
//! and `e` dimensions flattened, and whose columns are its `d`: a Hugging Face
//! `nn.Linear` weight (`[out, in]`) of a shardc `[D, H, E]` parameter. The
//! right side names the parameter's dimensions in order (so their sizes come
//! from the model); the left side may group them and put them in any order.
//! The same rule converts both ways: into the model (`--init`) and back out
//! (`shardc export`).

use std::collections::HashMap;

/// A parsed layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The file's dimensions, each a group of the parameter's.
    file: Vec<Vec<String>>,
    /// The parameter's dimensions, in order.
    param: Vec<String>,
    /// As written.
    text: String,
}

/// Why a layout does not parse or does not fit its parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutError(pub String);

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_name(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The groups of one side: `(h e) d` → `[[h, e], [d]]`.
fn side(text: &str) -> Result<Vec<Vec<String>>, LayoutError> {
    let spaced = text.replace('(', " ( ").replace(')', " ) ");
    let mut groups = Vec::new();
    let mut open: Option<Vec<String>> = None;
    for tok in spaced.split_whitespace() {
        match (tok, &mut open) {
            ("(", Some(_)) => return Err(LayoutError("groups do not nest".into())),
            ("(", None) => open = Some(Vec::new()),
            (")", None) => return Err(LayoutError("`)` without its `(`".into())),
            (")", Some(g)) => {
                if g.is_empty() {
                    return Err(LayoutError("an empty group `()`".into()));
                }
                groups.push(std::mem::take(g));
                open = None;
            }
            (name, _) if !is_name(name) => {
                return Err(LayoutError(format!(
                    "`{name}` is not a dimension name (letters, digits and `_`)"
                )))
            }
            (name, Some(g)) => g.push(name.to_string()),
            (name, None) => groups.push(vec![name.to_string()]),
        }
    }
    if open.is_some() {
        return Err(LayoutError("`(` without its `)`".into()));
    }
    Ok(groups)
}

impl Layout {
    pub fn parse(text: &str) -> Result<Layout, LayoutError> {
        let Some((left, right)) = text.split_once("->") else {
            return Err(LayoutError(
                "a layout is `FILE -> PARAMETER`, e.g. `(h e) d -> d h e`".into(),
            ));
        };
        let file = side(left)?;
        let param_groups = side(right)?;
        if right.contains(['(', ')']) {
            return Err(LayoutError(
                "the right side names the parameter's dimensions one by one (no groups)".into(),
            ));
        }
        let param: Vec<String> = param_groups.into_iter().flatten().collect();
        if param.is_empty() {
            return Err(LayoutError("the parameter side names no dimension".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for n in &param {
            if !seen.insert(n.as_str()) {
                return Err(LayoutError(format!("`{n}` is named twice on the right")));
            }
        }
        let mut left_seen = std::collections::HashSet::new();
        for n in file.iter().flatten() {
            if !left_seen.insert(n.as_str()) {
                return Err(LayoutError(format!("`{n}` is named twice on the left")));
            }
            if !seen.contains(n.as_str()) {
                return Err(LayoutError(format!(
                    "`{n}` is not one of the parameter's dimensions (right side)"
                )));
            }
        }
        if let Some(n) = param.iter().find(|n| !left_seen.contains(n.as_str())) {
            return Err(LayoutError(format!(
                "the parameter's `{n}` is not on the left: every dimension must be stored"
            )));
        }
        Ok(Layout {
            file,
            param,
            text: text.trim().to_string(),
        })
    }

    /// The layout as written, e.g. `(h e) d -> d h e`.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The parameter's rank this layout is written for.
    pub fn rank(&self) -> usize {
        self.param.len()
    }

    /// The shape the file stores for a parameter of `shape`.
    pub fn file_shape(&self, shape: &[usize]) -> Result<Vec<usize>, LayoutError> {
        let sizes = self.sizes(shape)?;
        Ok(self
            .file
            .iter()
            .map(|g| g.iter().map(|n| sizes[n.as_str()]).product())
            .collect())
    }

    fn sizes(&self, shape: &[usize]) -> Result<HashMap<&str, usize>, LayoutError> {
        if shape.len() != self.param.len() {
            return Err(LayoutError(format!(
                "the layout names {} parameter dimension(s) ({}), the parameter has {} ({shape:?})",
                self.param.len(),
                self.param.join(" "),
                shape.len()
            )));
        }
        Ok(self
            .param
            .iter()
            .map(String::as_str)
            .zip(shape.iter().copied())
            .collect())
    }

    /// The file's dimensions one by one, in its order.
    fn file_order(&self) -> Vec<&str> {
        self.file.iter().flatten().map(String::as_str).collect()
    }

    /// A file tensor's values (row-major, in the file's shape) as the
    /// parameter's (row-major, `shape`).
    pub fn to_param(&self, data: &[f64], shape: &[usize]) -> Result<Vec<f64>, LayoutError> {
        let sizes = self.sizes(shape)?;
        let order = self.file_order();
        let dims: Vec<usize> = order.iter().map(|n| sizes[n]).collect();
        let perm: Vec<usize> = self
            .param
            .iter()
            .map(|n| order.iter().position(|o| o == n).unwrap_or(0))
            .collect();
        Ok(permute(data, &dims, &perm))
    }

    /// A parameter's values (row-major, `shape`) as the file stores them.
    pub fn to_file(&self, data: &[f64], shape: &[usize]) -> Result<Vec<f64>, LayoutError> {
        self.sizes(shape)?;
        let perm: Vec<usize> = self
            .file_order()
            .iter()
            .map(|n| self.param.iter().position(|p| p == n).unwrap_or(0))
            .collect();
        Ok(permute(data, shape, &perm))
    }
}

/// `data` of row-major shape `dims` with its axes reordered: output axis `j`
/// is input axis `perm[j]`.
fn permute(data: &[f64], dims: &[usize], perm: &[usize]) -> Vec<f64> {
    if perm.iter().enumerate().all(|(j, &p)| j == p) {
        return data.to_vec();
    }
    let mut strides = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let out_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; dims.len()];
    let mut off = 0usize;
    for _ in 0..n {
        out.push(data[off]);
        // Advance the output index (last axis fastest), keeping `off` in step.
        for j in (0..idx.len()).rev() {
            idx[j] += 1;
            off += out_strides[j];
            if idx[j] < out_dims[j] {
                break;
            }
            off -= out_strides[j] * out_dims[j];
            idx[j] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linear_weight_is_transposed_and_split() {
        // A [D=2, H=2, E=3] parameter stored as HF's [(h e), d].
        let l = Layout::parse("(h e) d -> d h e").unwrap();
        assert_eq!(l.file_shape(&[2, 2, 3]).unwrap(), vec![6, 2]);
        let param: Vec<f64> = (0..12).map(f64::from).collect();
        let file = l.to_file(&param, &[2, 2, 3]).unwrap();
        // file[(h e), d] = param[d, h, e]
        for d in 0..2 {
            for he in 0..6 {
                assert_eq!(file[he * 2 + d], param[d * 6 + he]);
            }
        }
        assert_eq!(l.to_param(&file, &[2, 2, 3]).unwrap(), param);
    }

    #[test]
    fn the_identity_keeps_the_data() {
        let l = Layout::parse("d (k h e) -> d k h e").unwrap();
        assert_eq!(l.file_shape(&[4, 3, 2, 2]).unwrap(), vec![4, 12]);
        let v: Vec<f64> = (0..48).map(f64::from).collect();
        assert_eq!(l.to_param(&v, &[4, 3, 2, 2]).unwrap(), v);
    }

    #[test]
    fn bad_layouts() {
        for bad in [
            "d h",
            "(h e d -> d h e",
            "h e) d -> d h e",
            "((h) e) d -> d h e",
            "h d -> d h e",
            "h e d x -> d h e",
            "h h d -> d h",
            "d h -> d (h)",
            "d 2 -> d",
        ] {
            assert!(Layout::parse(bad).is_err(), "{bad}");
        }
        let l = Layout::parse("o i -> i o").unwrap();
        assert!(l.file_shape(&[2, 3, 4]).is_err());
    }
}
