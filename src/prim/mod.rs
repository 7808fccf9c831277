//! Primitives: one definition per op.
//!
//! Every op of the SPMD program is a [`Prim`], a typed value whose attributes
//! (a softmax's dim, a dropout rate, an einsum's specification, a collective's
//! axes) the checker reads once from the source. Everything about one op, or one
//! family of ops, lives in one module of this directory:
//!
//! - its [`Def`]s: the name a `.shard` file calls it by, its signature and row of
//!   the language reference, its type and sharding rule (which reports the
//!   collectives the layout implies), and the calls the generated tests make;
//! - its [`Primitive`] implementation: the forward kernel on one device's local
//!   pieces, the derivative (vector-Jacobian product, with the transposes of the
//!   collectives it implies), and its cost for `shardc plan` (FLOPs and bytes
//!   moved).
//!
//! The registry ([`defs`], [`find`]) serves name lookup and did-you-mean, and the
//! lists the language reference and the editor grammars are generated from
//! (`tests/registry.rs` keeps them in step). Adding an op is one module plus one
//! line in the `families!` list below.

use crate::types::TType;
use candle_core::Tensor;

pub mod cost;
pub mod docs;
pub mod kernel;
pub mod rules;

pub mod along;
pub mod arith;
pub mod attention;
pub mod aux;
pub mod axis_index;
pub mod bcast_fast;
pub mod cast;
pub mod collective;
pub mod concat;
pub mod create;
pub mod cross_entropy;
pub mod cross_entropy_fast;
pub mod dropout;
pub mod einsum;
mod einsum_plan;
pub mod elementwise;
pub mod embed;
mod flash;
pub mod gather;
#[cfg(feature = "cuda")]
pub(crate) mod gpu;
pub mod index;
pub mod lookup;
pub mod matmul;
pub mod matmul_split;
pub mod metrics;
pub mod norm;
#[cfg(feature = "cuda")]
mod norm_gpu;
pub mod objective;
pub mod one_hot;
pub mod reduce;
pub mod reduce_fast;
pub mod reshard;
pub mod ring;
pub mod shape;
pub mod softmax;
pub mod total;
pub mod unary;
pub mod unary_fast;

pub use cost::{CommCost, Cost, CostCx};
pub use kernel::Kernel;
pub use rules::{Call, Rules, Typed};

/// A kernel's result: its value, or why it stopped ([`crate::fault::Fault`]).
pub type R<T> = std::result::Result<T, crate::fault::Fault>;

/// What a forward kernel returns: the value, and what its derivative needs
/// that cannot be recomputed from the operands (a dropout mask; a loss's
/// exponentials and row sums).
pub struct Forward {
    pub y: Tensor,
    pub saved: Vec<Tensor>,
}

impl Forward {
    pub fn of(y: Tensor) -> R<Forward> {
        Ok(Forward {
            y,
            saved: Vec::new(),
        })
    }
}

/// What a derivative gets: the operands' local values and types, the op's
/// output, what forward saved, and the output's cotangent.
pub struct Grad<'a> {
    pub x: &'a [&'a Tensor],
    pub ts: &'a [&'a TType],
    pub y: &'a Tensor,
    pub out: &'a TType,
    pub saved: &'a [Tensor],
    pub g: &'a Tensor,
    /// Per operand: whether its cotangent is wanted (it depends on a
    /// parameter). A derivative may return `None` for the others and skip
    /// their work (matmul does); it must do so the same way on every device.
    pub want: &'a [bool],
}

/// The behaviour of one typed op. The attributes are the implementing struct's
/// fields; operands arrive as local pieces with their (global) types, so a kernel
/// can see how each operand is laid out on the mesh.
pub trait Primitive {
    /// The name `shardc lower` prints (the source name, or the operator).
    fn name(&self) -> &'static str;
    /// Attributes as `shardc lower` prints them after the operands.
    fn attrs(&self) -> Vec<String> {
        Vec::new()
    }
    /// The op as `shardc lower` prints it, given its operands (`%3`).
    fn render(&self, args: &[String]) -> String {
        let mut a = args.to_vec();
        a.extend(self.attrs());
        format!("{}({})", self.name(), a.join(", "))
    }
    /// The op on this device's local pieces.
    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward>;
    /// Cotangents of the operands (`None`: no gradient flows to that operand),
    /// in the operands' layouts. The default says there is none, which
    /// `tests/registry.rs` refuses for a differentiable op.
    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let _ = (k, g);
        Err(format!("`{}` has no derivative", self.name()).into())
    }
    /// Whether the op accumulates (softmax, norms, reductions, losses): under
    /// mixed precision it runs in f32 on its widened 16-bit operands, and its
    /// result and cotangents go back in the 16-bit type.
    fn accumulates(&self) -> bool {
        false
    }
    /// Whether its derivative performs the collectives its forward does
    /// (transposed): the plan counts them twice. A loss's and the metrics'
    /// derivatives communicate nothing.
    fn backward_comms(&self) -> bool {
        true
    }
    /// FLOPs beyond one per output element, and the bytes each device moves,
    /// per forward pass. The default (`None`) means the op has no cost model,
    /// which `tests/registry.rs` refuses.
    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        let _ = (c, ts, out);
        None
    }
}

/// How an op is written, for editors and the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A built-in function: `relu(x)`.
    Function,
    /// A collective over mesh axes: `psum(x, mp)`.
    Collective,
    /// Written with syntax (`+`, `@`, `x[k]`) or inserted by the checker.
    Operator,
}

/// A type rule: checks a call's arguments through the checker's services and
/// gives the result type and the typed op (`None`: an error was reported).
pub type Check = fn(&mut dyn Rules, &Call) -> Option<Typed>;

/// One named op (or operator) as the language knows it.
pub struct Def {
    pub name: &'static str,
    pub kind: Kind,
    /// How it is called, e.g. `softmax(x, dim: -1)`.
    pub signature: &'static str,
    /// Its typing and sharding rule: this op's row of the language reference.
    pub rule: &'static str,
    /// The type rule of a named op (`None` for operators, which the checker
    /// reaches through syntax).
    pub check: Option<Check>,
    /// Calls the generated tests make, with operands written `{name: type}`
    /// (see `tests/prims.rs`): each is checked and run on every operand layout
    /// the checker accepts, against one device and against finite differences.
    pub examples: &'static [&'static str],
    /// Whether gradients flow through it (its derivative is tested against
    /// finite differences).
    pub differentiable: bool,
    /// Whether its result is the one device's, whatever the mesh: true of
    /// every function of the global values; false of collectives whose
    /// meaning depends on the axis (`pmean` divides by its size, `ppermute`
    /// moves blocks, `psum` of a value that is not pending adds its copies).
    pub same_on_one_device: bool,
}

macro_rules! families {
    ($($variant:ident($ty:ty) => $module:ident,)*) => {
        /// A typed op of the SPMD program, with its attributes.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Prim {
            $($variant($ty),)*
        }

        $(impl From<$ty> for Prim {
            fn from(p: $ty) -> Prim {
                Prim::$variant(p)
            }
        })*

        impl Prim {
            /// The op's behaviour.
            pub fn get(&self) -> &dyn Primitive {
                match self {
                    $(Prim::$variant(p) => p,)*
                }
            }
        }

        /// Every op the language has, family by family.
        pub fn defs() -> impl Iterator<Item = &'static Def> {
            std::iter::empty()$(.chain($module::DEFS.iter()))*
        }
    };
}

families! {
    Arith(arith::Arith) => arith,
    MatMul(matmul::MatMul) => matmul,
    Unary(unary::Unary) => unary,
    Softmax(softmax::Softmax) => softmax,
    Norm(norm::Norm) => norm,
    Reduce(reduce::Reduce) => reduce,
    Einsum(einsum::Einsum) => einsum,
    Shape(shape::Shape) => shape,
    Index(index::Index) => index,
    Cast(cast::Cast) => cast,
    Concat(concat::Concat) => concat,
    Elementwise(elementwise::Elementwise) => elementwise,
    Along(along::Along) => along,
    Gather(gather::Gather) => gather,
    Create(create::Create) => create,
    Dropout(dropout::Dropout) => dropout,
    OneHot(one_hot::OneHot) => one_hot,
    Embed(embed::Embed) => embed,
    Lookup(lookup::Lookup) => lookup,
    Attention(attention::Attention) => attention,
    CrossEntropy(cross_entropy::CrossEntropy) => cross_entropy,
    Objective(objective::Objective) => objective,
    Metrics(metrics::Metrics) => metrics,
    Collective(collective::Collective) => collective,
    AxisIndex(axis_index::AxisIndex) => axis_index,
    Reshard(reshard::Reshard) => reshard,
    Aux(aux::Aux) => aux,
    StepTotal(total::StepTotal) => total,
}

/// The named op (function or collective) called `name`.
pub fn find(name: &str) -> Option<&'static Def> {
    defs().find(|d| d.name == name && d.kind != Kind::Operator)
}

/// Names a call can use, for did-you-mean.
pub fn names() -> Vec<&'static str> {
    defs()
        .filter(|d| d.kind != Kind::Operator)
        .map(|d| d.name)
        .collect()
}
