//! `shardc run --profile`: where a step's time goes, by op and by phase.
//!
//! Why: a GPU step that is 30× slower than it should be is a question no
//! plan answers; the answer is which kernels take the time. With `--profile`
//! every op of the step program, and each phase of the step around it (the
//! gradient sync, the norm, the optimizer), is timed between two
//! synchronisations of its device, so an asynchronous GPU's time lands on the
//! op that spent it. The synchronisations slow the step, so the figures say
//! where the time goes, not how fast an unprofiled step is. The first step
//! (kernel loading, first touches of memory) is left out when there are more.
//!
//! Off (the default) it costs one relaxed atomic load per op.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::Device;

static ON: AtomicBool = AtomicBool::new(false);
static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// Which part of a step a timing belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Forward,
    Backward,
    Step,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Step => "step",
        }
    }
}

/// What one step, or the steps after the first, recorded.
#[derive(Default)]
struct Part {
    /// Per (phase, op or part): calls and time.
    by_op: HashMap<(Phase, &'static str), (u64, Duration)>,
    /// Per program node (forward and backward together): time.
    by_node: HashMap<(usize, &'static str), (u64, Duration)>,
}

/// Every record is filed under the step its device was in ([`device_step`]):
/// the devices of a process do not begin a step together (one may still run
/// the last step's optimizer or eval while another has begun the next), so
/// a step's boundary on one device is not the others'.
#[derive(Default)]
struct Table {
    /// The first step any device recorded (kernel loading, first touches of
    /// memory): left out when there are more.
    first: Option<usize>,
    first_part: Part,
    /// The steps after the first, added up.
    later: Part,
    /// The last step recorded.
    last: usize,
    /// Per step (the last [`KEPT`] + 1) and program node: seconds in its
    /// forward, and in its derivatives toward data and toward weights (the
    /// pipeline's input- and weight-gradient halves), for [`pass_steps`].
    passes: std::collections::BTreeMap<usize, HashMap<usize, [f64; 3]>>,
}

impl Table {
    /// The steps the figures cover: those after the first when there are
    /// more, else the first.
    fn steps(&self) -> usize {
        match self.first {
            Some(f) if self.last > f => self.last - f,
            Some(_) => 1,
            None => 0,
        }
    }
    fn part(&self) -> &Part {
        match self.first {
            Some(f) if self.last > f => &self.later,
            _ => &self.first_part,
        }
    }
}

thread_local! {
    /// The step this thread's device is in ([`device_step`]); `None` on a
    /// thread that runs no device (its records go with the last step).
    static STEP: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Every device's thread says which step it begins.
pub fn device_step(step: usize) {
    STEP.with(|s| s.set(Some(step)));
}

/// Steps whose node times [`pass_steps`] gives (and [`pass_times`] takes the median of).
const KEPT: usize = 64;

/// Turn profiling on for this process (`--profile`).
pub fn enable() {
    ON.store(true, Ordering::Relaxed);
    if let Ok(mut t) = TABLE.lock() {
        *t = Some(Table::default());
    }
}

/// Turn profiling off again (a benchmark that profiled one run).
pub fn disable() {
    ON.store(false, Ordering::Relaxed);
}

/// Whether `--profile` is on.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Run `f`, timing it between two synchronisations of `dev` when profiling,
/// under `phase` and `what` (and the program node, when it is one).
pub fn time<T>(
    dev: &Device,
    phase: Phase,
    what: &'static str,
    node: Option<usize>,
    f: impl FnOnce() -> T,
) -> T {
    if !on() {
        return f();
    }
    let (r, d) = synchronised(dev, f);
    record(phase, what, node, d, None);
    r
}

/// [`time`] for the forward of node `node` (`weight_share`: `None`) or its
/// derivative, `weight_share` of whose operands are the weights' (the
/// derivative's time is split in that proportion between the two halves of
/// the backward; a split backward times each half on its own: 0 or 1).
pub fn time_node<T>(
    dev: &Device,
    what: &'static str,
    node: usize,
    weight_share: Option<f64>,
    f: impl FnOnce() -> T,
) -> T {
    if !on() {
        return f();
    }
    let phase = match weight_share {
        None => Phase::Forward,
        Some(_) => Phase::Backward,
    };
    let (r, d) = synchronised(dev, f);
    record(phase, what, Some(node), d, Some(weight_share));
    r
}

fn synchronised<T>(dev: &Device, f: impl FnOnce() -> T) -> (T, Duration) {
    let _ = dev.synchronize();
    let t0 = Instant::now();
    let r = f();
    let _ = dev.synchronize();
    (r, t0.elapsed())
}

/// Adds `d` to the tables; `pass`: also to the node's passes (see
/// [`time_node`]).
fn record(
    phase: Phase,
    what: &'static str,
    node: Option<usize>,
    d: Duration,
    pass: Option<Option<f64>>,
) {
    let Ok(mut g) = TABLE.lock() else { return };
    let t = g.get_or_insert_with(Table::default);
    let step = STEP.with(|s| s.get()).unwrap_or(t.last);
    let first = *t.first.get_or_insert(step);
    t.last = t.last.max(step);
    let part = if step == first {
        &mut t.first_part
    } else {
        &mut t.later
    };
    let e = part.by_op.entry((phase, what)).or_default();
    e.0 += 1;
    e.1 += d;
    let Some(n) = node else { return };
    let e = part.by_node.entry((n, what)).or_default();
    e.0 += 1;
    e.1 += d;
    let secs = d.as_secs_f64();
    let e = t.passes.entry(step).or_default().entry(n).or_default();
    match pass {
        None => {}
        Some(None) => e[0] += secs,
        Some(Some(w)) => {
            let w = w.clamp(0.0, 1.0);
            e[1] += secs * (1.0 - w);
            e[2] += secs * w;
        }
    }
    while t.passes.len() > KEPT + 1 {
        t.passes.pop_first();
    }
}

/// Per step timed (the last [`KEPT`]) and per program node of `nodes`,
/// milliseconds in its forward and in the two halves of its backward (see
/// [`time_node`]), this process's devices added up. `None` when not
/// profiling.
pub fn pass_steps(nodes: usize) -> Option<Vec<Vec<[f64; 3]>>> {
    if !on() {
        return None;
    }
    let g = TABLE.lock().ok()?;
    let t = g.as_ref()?;
    // The first step is left out when there are more.
    let skip = usize::from(t.passes.len() > 1 && t.first == t.passes.keys().next().copied());
    let steps = t
        .passes
        .values()
        .skip(skip)
        .rev()
        .take(KEPT)
        .rev()
        .map(|s| {
            (0..nodes)
                .map(|n| s.get(&n).map_or([0.0; 3], |a| a.map(|x| x * 1e3)))
                .collect()
        })
        .collect();
    Some(steps)
}

/// Per node, the median over `steps` (as [`pass_steps`] gives them) of each
/// of its three times, so that a step the machine slowed does not count.
pub fn medians(steps: &[Vec<[f64; 3]>], nodes: usize) -> Vec<[f64; 3]> {
    let mut out = vec![[0.0; 3]; nodes];
    for (n, o) in out.iter_mut().enumerate() {
        for (k, x) in o.iter_mut().enumerate() {
            let mut v: Vec<f64> = steps
                .iter()
                .map(|s| s.get(n).map_or(0.0, |a| a[k]))
                .collect();
            v.sort_by(f64::total_cmp);
            *x = v.get(v.len() / 2).copied().unwrap_or(0.0);
        }
    }
    out
}

/// Per program node of `nodes`, the median milliseconds of [`medians`], and
/// how many steps were timed. `None` when not profiling.
pub fn pass_times(nodes: usize) -> Option<(Vec<[f64; 3]>, usize)> {
    let steps = pass_steps(nodes)?;
    Some((medians(&steps, nodes), steps.len()))
}

/// The table `--profile` prints at the end of a run: ops by total time, then
/// the program nodes that took the most (`line` names a node's source).
/// `devices`: how many of the mesh's devices this process runs; their
/// times add up (and on a shared CPU include waiting for each other).
pub fn report(line: &dyn Fn(usize) -> String, devices: usize) -> Option<String> {
    if !on() {
        return None;
    }
    let g = TABLE.lock().ok()?;
    let t = g.as_ref()?;
    let (part, timed) = (t.part(), t.steps());
    let steps = timed.max(1) as f64;
    let total: Duration = part.by_op.values().map(|v| v.1).sum();
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / steps;
    let over = if devices > 1 {
        format!(", summed over this process's {devices} devices (each op's time includes waiting for the others)")
    } else {
        String::new()
    };
    let mut out = format!(
        "profile: {:.1} ms per step over {} step(s){over}; each op timed between two device synchronisations\n",
        ms(total),
        timed
    );
    out.push_str("  phase     op                        calls/step   ms/step   share\n");
    let mut rows: Vec<_> = part.by_op.iter().collect();
    rows.sort_by(|a, b| b.1 .1.cmp(&a.1 .1).then(a.0.cmp(b.0)));
    for ((phase, what), (n, d)) in rows {
        out.push_str(&format!(
            "  {:<9} {:<25} {:>10.0} {:>9.2} {:>6.1}%\n",
            phase.label(),
            what,
            *n as f64 / steps,
            ms(*d),
            100.0 * d.as_secs_f64() / total.as_secs_f64().max(1e-12)
        ));
    }
    let mut nodes: Vec<_> = part.by_node.iter().collect();
    nodes.sort_by(|a, b| b.1 .1.cmp(&a.1 .1).then(a.0.cmp(b.0)));
    out.push_str("  slowest nodes (forward + backward):\n");
    for ((n, what), (_, d)) in nodes.into_iter().take(12) {
        out.push_str(&format!(
            "  {:>9.2} ms  %{n} {what}  {}\n",
            ms(*d),
            line(*n)
        ));
    }
    Some(out)
}
