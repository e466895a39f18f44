//! Replays AIPerf 0.13.0's coding templates: loads `assets/aiperf-coding/templates.json` (the
//! vocabulary and the template methods' syntax trees, extracted by
//! `tools/extract_aiperf_coding.py`) and evaluates a method with Python's semantics for the
//! subset the templates use, drawing from the template stream in exactly AIPerf's order
//! (left-to-right arguments, eager dict literals and `.get` defaults, short-circuit `and`/`or`).
//! Owns that evaluation; must never draw from anything but the stream it is given, and never
//! hold template text itself (it all comes from the asset).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::OnceLock;

use serde::Deserialize;

use super::pyfmt::{self, Arg, Piece};
use super::FastMap;
use crate::synth::rng::PyRandom;

const TEMPLATES_JSON: &str = include_str!("../../../../assets/aiperf-coding/templates.json");

/// An expression node (the extractor's `"e"` tag).
#[derive(Debug, Deserialize)]
#[serde(tag = "e", rename_all = "lowercase")]
pub enum Expr {
    None,
    Bool {
        v: bool,
    },
    Int {
        v: i64,
    },
    Float {
        v: f64,
    },
    Str {
        v: String,
    },
    /// One `{value:spec}` of an f-string.
    Fmt {
        value: Box<Expr>,
        spec: Option<Vec<Expr>>,
    },
    Name {
        id: String,
    },
    Attr {
        value: Box<Expr>,
        attr: String,
    },
    Fstr {
        parts: Vec<Expr>,
    },
    Call {
        func: Box<Expr>,
        args: Vec<Expr>,
        kwargs: Vec<(String, Expr)>,
    },
    Bin {
        op: String,
        l: Box<Expr>,
        r: Box<Expr>,
    },
    Unary {
        op: String,
        v: Box<Expr>,
    },
    Boolop {
        op: String,
        values: Vec<Expr>,
    },
    Cmp {
        l: Box<Expr>,
        ops: Vec<String>,
        rs: Vec<Expr>,
    },
    Ifexp {
        test: Box<Expr>,
        body: Box<Expr>,
        orelse: Box<Expr>,
    },
    List {
        elts: Vec<Expr>,
    },
    Tuple {
        elts: Vec<Expr>,
    },
    Starred {
        v: Box<Expr>,
    },
    Dict {
        keys: Vec<Expr>,
        values: Vec<Expr>,
    },
    Index {
        value: Box<Expr>,
        index: Box<Expr>,
    },
    Listcomp {
        elt: Box<Expr>,
        gens: Vec<Comprehension>,
    },
    Lambda {
        body: Box<Expr>,
    },
}

/// One `for target in iter if …` clause.
#[derive(Debug, Deserialize)]
pub struct Comprehension {
    target: Expr,
    iter: Expr,
    ifs: Vec<Expr>,
}

/// A statement node (the extractor's `"s"` tag).
#[derive(Debug, Deserialize)]
#[serde(tag = "s", rename_all = "lowercase")]
pub enum Stmt {
    Expr {
        value: Expr,
    },
    Assign {
        targets: Vec<Expr>,
        value: Expr,
    },
    Augassign {
        target: Expr,
        op: String,
        value: Expr,
    },
    Return {
        value: Expr,
    },
    If {
        test: Expr,
        body: Vec<Stmt>,
        orelse: Vec<Stmt>,
    },
    For {
        target: Expr,
        iter: Expr,
        body: Vec<Stmt>,
    },
}

/// A template method.
#[derive(Debug, Deserialize)]
pub struct Method {
    params: Vec<String>,
    defaults: Vec<Option<Expr>>,
    body: Vec<Stmt>,
}

/// The whole asset.
#[derive(Debug, Deserialize)]
pub struct Templates {
    pub aiperf_version: String,
    pub source_sha256: String,
    /// Generator name and block count, in AIPerf's order.
    pub tool_pool_block_counts: Vec<(String, usize)>,
    pub text_pool_blocks: usize,
    pub baseline_pool_tokens: u64,
    constants: HashMap<String, serde_json::Value>,
    methods: FastMap<String, Method>,
}

/// The parsed asset (parsed once per process).
#[allow(clippy::expect_used)] // the invariant is named at the expect
pub fn templates() -> &'static Templates {
    static T: OnceLock<Templates> = OnceLock::new();
    // The asset is embedded at compile time and checked by the tests; a parse failure is a
    // build defect, not a run-time condition.
    T.get_or_init(|| serde_json::from_str(TEMPLATES_JSON).expect("embedded templates.json parses"))
}

/// A Python `str`: a literal of the asset (no copy) or a string made at run time.
#[derive(Clone, Debug)]
enum PyStr {
    Static(&'static str),
    Owned(Rc<str>),
}

impl std::ops::Deref for PyStr {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            PyStr::Static(t) => t,
            PyStr::Owned(t) => t,
        }
    }
}

/// A Python value.
#[derive(Clone, Debug)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(PyStr),
    List(Rc<RefCell<Vec<Value>>>),
    Tuple(Rc<Vec<Value>>),
    Dict(Rc<Vec<(Value, Value)>>),
    /// `_SafeFormatMap(d)`: a dict whose missing keys format as `{key}`.
    SafeMap(Rc<Vec<(Value, Value)>>),
    /// A bound template method (`self._gen_…`).
    Method(&'static str),
    Lambda(Rc<(&'static Expr, Env)>),
    /// `self._template_rng`.
    Rng,
    SelfObj,
}

type Env = FastMap<&'static str, Value>;

/// An evaluation error: the template uses something the interpreter does not support.
pub type Error = String;

fn s(v: &str) -> Value {
    Value::Str(PyStr::Owned(Rc::from(v)))
}

fn from_json(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::None,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(0.0)),
        },
        serde_json::Value::String(t) => s(t),
        serde_json::Value::Array(a) => Value::Tuple(Rc::new(a.iter().map(from_json).collect())),
        // The extractor writes dicts as `{"dict": [[key, value], ...]}`, in Python's order.
        serde_json::Value::Object(o) => Value::Dict(Rc::new(
            o.get("dict")
                .and_then(serde_json::Value::as_array)
                .map(|pairs| {
                    pairs
                        .iter()
                        .filter_map(|p| Some((from_json(p.get(0)?), from_json(p.get(1)?))))
                        .collect()
                })
                .unwrap_or_default(),
        )),
    }
}

impl Value {
    fn truthy(&self) -> bool {
        match self {
            Value::None => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(t) => !t.is_empty(),
            Value::List(l) => !l.borrow().is_empty(),
            Value::Tuple(t) => !t.is_empty(),
            Value::Dict(d) | Value::SafeMap(d) => !d.is_empty(),
            _ => true,
        }
    }

    /// Items of an iterable (strings iterate chars, dicts keys).
    fn items(&self) -> Result<Vec<Value>, Error> {
        Ok(match self {
            Value::List(l) => l.borrow().clone(),
            Value::Tuple(t) => t.as_ref().clone(),
            Value::Str(t) => t.chars().map(|c| s(c.encode_utf8(&mut [0; 4]))).collect(),
            Value::Dict(d) | Value::SafeMap(d) => d.iter().map(|(k, _)| k.clone()).collect(),
            other => return Err(format!("{other:?} is not iterable")),
        })
    }

    /// `len(x)` without copying the items.
    fn len(&self) -> Result<usize, Error> {
        Ok(match self {
            Value::List(l) => l.borrow().len(),
            Value::Tuple(t) => t.len(),
            Value::Str(t) => t.chars().count(),
            Value::Dict(d) | Value::SafeMap(d) => d.len(),
            other => return Err(format!("len() of {other:?}")),
        })
    }

    fn as_int(&self) -> Result<i64, Error> {
        match self {
            Value::Int(i) => Ok(*i),
            Value::Bool(b) => Ok(i64::from(*b)),
            other => Err(format!("expected an int, got {other:?}")),
        }
    }

    fn as_f64(&self) -> Result<f64, Error> {
        match self {
            Value::Float(f) => Ok(*f),
            other => other.as_int().map(|i| i as f64),
        }
    }

    fn as_str(&self) -> Result<&str, Error> {
        match self {
            Value::Str(t) => Ok(t),
            other => Err(format!("expected a str, got {other:?}")),
        }
    }

    /// `str(x)`.
    fn to_str(&self) -> Result<String, Error> {
        Ok(match self {
            Value::None => "None".into(),
            Value::Bool(true) => "True".into(),
            Value::Bool(false) => "False".into(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => pyfmt::float_repr(*f),
            Value::Str(t) => t.to_string(),
            other => return Err(format!("str() of {other:?} is not supported")),
        })
    }

    /// `format(x, spec)`.
    fn format(&self, spec: &str) -> Result<String, Error> {
        match self {
            Value::Str(t) => pyfmt::format_value(Arg::Str(t), spec),
            Value::Int(i) => pyfmt::format_value(Arg::Int(*i), spec),
            Value::Float(f) => pyfmt::format_value(Arg::Float(*f), spec),
            Value::Bool(b) if !spec.is_empty() => {
                pyfmt::format_value(Arg::Int(i64::from(*b)), spec)
            }
            other if spec.is_empty() => other.to_str(),
            other => Err(format!("format({other:?}, {spec:?}) is not supported")),
        }
    }
}

fn py_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::None, Value::None) => true,
        (Value::Str(x), Value::Str(y)) => **x == **y,
        (Value::Float(_), _) | (_, Value::Float(_)) => match (a.as_f64(), b.as_f64()) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        },
        (Value::Int(_) | Value::Bool(_), Value::Int(_) | Value::Bool(_)) => {
            a.as_int().ok() == b.as_int().ok()
        }
        (Value::Tuple(x), Value::Tuple(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| py_eq(p, q))
        }
        _ => false,
    }
}

fn dict_get<'a>(d: &'a [(Value, Value)], key: &Value) -> Option<&'a Value> {
    d.iter().find(|(k, _)| py_eq(k, key)).map(|(_, v)| v)
}

/// Evaluates template methods against one template stream.
pub struct Interp<'r> {
    t: &'static Templates,
    rng: &'r mut PyRandom,
    globals: Env,
}

enum Flow {
    Next,
    Return(Value),
}

impl<'r> Interp<'r> {
    /// An interpreter drawing from `rng` (the Python side of `dataset.coding_content.template`).
    pub fn new(rng: &'r mut PyRandom) -> Self {
        let t = templates();
        let globals = t
            .constants
            .iter()
            .map(|(k, v)| (k.as_str(), from_json(v)))
            .collect();
        Interp { t, rng, globals }
    }

    /// Calls the template method `name` with no arguments and returns its text.
    pub fn generate(&mut self, name: &str) -> Result<String, Error> {
        let name = self
            .t
            .methods
            .get_key_value(name)
            .map(|(k, _)| k.as_str())
            .ok_or_else(|| format!("no template method {name}"))?;
        match self.call_method(name, Vec::new(), Vec::new())? {
            Value::Str(t) => Ok(t.to_string()),
            other => Err(format!("{name} returned {other:?}, not a str")),
        }
    }

    fn call_method(
        &mut self,
        name: &'static str,
        args: Vec<Value>,
        kwargs: Vec<(&'static str, Value)>,
    ) -> Result<Value, Error> {
        let m = self
            .t
            .methods
            .get(name)
            .ok_or_else(|| format!("no template method {name}"))?;
        let mut env = Env::default();
        env.insert("self", Value::SelfObj);
        if args.len() > m.params.len() {
            return Err(format!("{name}: too many arguments"));
        }
        let mut args = args.into_iter();
        for (i, p) in m.params.iter().enumerate() {
            let v = match args.next() {
                Some(v) => v,
                None => match kwargs.iter().find(|(k, _)| *k == p.as_str()) {
                    Some((_, v)) => v.clone(),
                    None => match &m.defaults[i] {
                        Some(d) => self.eval(d, &mut env)?,
                        None => return Err(format!("{name}: missing argument {p}")),
                    },
                },
            };
            env.insert(p.as_str(), v);
        }
        match self.exec(&m.body, &mut env)? {
            Flow::Return(v) => Ok(v),
            Flow::Next => Ok(Value::None),
        }
    }

    fn exec(&mut self, body: &'static [Stmt], env: &mut Env) -> Result<Flow, Error> {
        for st in body {
            match st {
                Stmt::Expr { value } => {
                    self.eval(value, env)?;
                }
                Stmt::Assign { targets, value } => {
                    let v = self.eval(value, env)?;
                    for t in targets {
                        bind(t, v.clone(), env)?;
                    }
                }
                Stmt::Augassign { target, op, value } => {
                    let cur = self.eval(target, env)?;
                    let rhs = self.eval(value, env)?;
                    bind(target, binop(op, &cur, &rhs)?, env)?;
                }
                Stmt::Return { value } => return Ok(Flow::Return(self.eval(value, env)?)),
                Stmt::If { test, body, orelse } => {
                    let branch = if self.eval(test, env)?.truthy() {
                        body
                    } else {
                        orelse
                    };
                    if let Flow::Return(v) = self.exec(branch, env)? {
                        return Ok(Flow::Return(v));
                    }
                }
                Stmt::For { target, iter, body } => {
                    for item in self.eval(iter, env)?.items()? {
                        bind(target, item, env)?;
                        if let Flow::Return(v) = self.exec(body, env)? {
                            return Ok(Flow::Return(v));
                        }
                    }
                }
            }
        }
        Ok(Flow::Next)
    }

    fn eval_all(&mut self, es: &'static [Expr], env: &mut Env) -> Result<Vec<Value>, Error> {
        let mut out = Vec::with_capacity(es.len());
        for e in es {
            if let Expr::Starred { v } = e {
                out.extend(self.eval(v, env)?.items()?);
            } else {
                out.push(self.eval(e, env)?);
            }
        }
        Ok(out)
    }

    fn eval(&mut self, e: &'static Expr, env: &mut Env) -> Result<Value, Error> {
        Ok(match e {
            Expr::None => Value::None,
            Expr::Bool { v } => Value::Bool(*v),
            Expr::Int { v } => Value::Int(*v),
            Expr::Float { v } => Value::Float(*v),
            Expr::Str { v } => Value::Str(PyStr::Static(v)),
            Expr::Name { id } => match env
                .get(id.as_str())
                .or_else(|| self.globals.get(id.as_str()))
            {
                Some(v) => v.clone(),
                None => return Err(format!("name {id} is not defined")),
            },
            Expr::Attr { value, attr } => self.attr(value, attr, env)?,
            Expr::Fstr { parts } => s(&self.fstring(parts, env)?),
            Expr::Fmt { .. } => return Err("a format field outside an f-string".into()),
            Expr::Call { func, args, kwargs } => self.call(func, args, kwargs, env)?,
            Expr::Bin { op, l, r } => {
                let a = self.eval(l, env)?;
                let b = self.eval(r, env)?;
                binop(op, &a, &b)?
            }
            Expr::Unary { op, v } => {
                let x = self.eval(v, env)?;
                match (op.as_str(), x) {
                    ("not", x) => Value::Bool(!x.truthy()),
                    ("-", Value::Float(f)) => Value::Float(-f),
                    ("-", x) => Value::Int(-x.as_int()?),
                    (op, x) => return Err(format!("unary {op} on {x:?}")),
                }
            }
            Expr::Boolop { op, values } => self.boolop(op, values, env)?,
            Expr::Cmp { l, ops, rs } => self.compare_chain(l, ops, rs, env)?,
            Expr::Ifexp { test, body, orelse } => {
                if self.eval(test, env)?.truthy() {
                    self.eval(body, env)?
                } else {
                    self.eval(orelse, env)?
                }
            }
            Expr::List { elts } => Value::List(Rc::new(RefCell::new(self.eval_all(elts, env)?))),
            Expr::Tuple { elts } => Value::Tuple(Rc::new(self.eval_all(elts, env)?)),
            Expr::Starred { .. } => return Err("a starred expression outside a list".into()),
            Expr::Dict { keys, values } => self.dict(keys, values, env)?,
            Expr::Index { value, index } => {
                let c = self.eval(value, env)?;
                let i = self.eval(index, env)?;
                index_of(&c, &i)?
            }
            Expr::Listcomp { elt, gens } => self.listcomp(elt, gens, env)?,
            Expr::Lambda { body } => Value::Lambda(Rc::new((body, env.clone()))),
        })
    }

    /// `value.attr`: only the template object's methods and its random stream.
    fn attr(&mut self, value: &'static Expr, attr: &str, env: &mut Env) -> Result<Value, Error> {
        Ok(match self.eval(value, env)? {
            Value::SelfObj if attr == "_template_rng" => Value::Rng,
            Value::SelfObj => match self.t.methods.get_key_value(attr) {
                Some((k, _)) => Value::Method(k.as_str()),
                None => return Err(format!("self.{attr} is not a template method")),
            },
            other => return Err(format!("attribute {attr} of {other:?} is not supported")),
        })
    }

    /// `and` / `or`: short-circuits, and yields the last operand evaluated, as Python does.
    fn boolop(&mut self, op: &str, values: &'static [Expr], env: &mut Env) -> Result<Value, Error> {
        let mut last = Value::None;
        for v in values {
            last = self.eval(v, env)?;
            if last.truthy() == (op == "or") {
                break;
            }
        }
        Ok(last)
    }

    /// `a < b <= c`: each operand evaluated once, stopping at the first false comparison.
    fn compare_chain(
        &mut self,
        l: &'static Expr,
        ops: &'static [String],
        rs: &'static [Expr],
        env: &mut Env,
    ) -> Result<Value, Error> {
        let mut a = self.eval(l, env)?;
        for (op, r) in ops.iter().zip(rs) {
            let b = self.eval(r, env)?;
            if !compare(op, &a, &b)? {
                return Ok(Value::Bool(false));
            }
            a = b;
        }
        Ok(Value::Bool(true))
    }

    /// A dict literal, evaluated in order; a repeated key keeps its first place and its last value.
    fn dict(
        &mut self,
        keys: &'static [Expr],
        values: &'static [Expr],
        env: &mut Env,
    ) -> Result<Value, Error> {
        let mut d = Vec::with_capacity(keys.len());
        for (k, v) in keys.iter().zip(values) {
            let k = self.eval(k, env)?;
            let v = self.eval(v, env)?;
            match d
                .iter_mut()
                .find(|(old, _): &&mut (Value, Value)| py_eq(old, &k))
            {
                Some(slot) => slot.1 = v,
                None => d.push((k, v)),
            }
        }
        Ok(Value::Dict(Rc::new(d)))
    }

    fn listcomp(
        &mut self,
        elt: &'static Expr,
        gens: &'static [Comprehension],
        env: &mut Env,
    ) -> Result<Value, Error> {
        // Comprehension variables do not leak: remember what they shadowed.
        let mut saved = Vec::new();
        for g in gens {
            names(&g.target, &mut |n| saved.push((n, env.get(n).cloned())));
        }
        let mut out = Vec::new();
        let r = self.comprehend(elt, gens, env, &mut out);
        for (n, v) in saved.into_iter().rev() {
            match v {
                Some(v) => env.insert(n, v),
                None => env.remove(n),
            };
        }
        r?;
        Ok(Value::List(Rc::new(RefCell::new(out))))
    }

    fn comprehend(
        &mut self,
        elt: &'static Expr,
        gens: &'static [Comprehension],
        env: &mut Env,
        out: &mut Vec<Value>,
    ) -> Result<(), Error> {
        let Some((g, rest)) = gens.split_first() else {
            out.push(self.eval(elt, env)?);
            return Ok(());
        };
        'items: for item in self.eval(&g.iter, env)?.items()? {
            bind(&g.target, item, env)?;
            for cond in &g.ifs {
                if !self.eval(cond, env)?.truthy() {
                    continue 'items;
                }
            }
            self.comprehend(elt, rest, env, out)?;
        }
        Ok(())
    }

    /// An f-string body (also a nested format spec): literal parts and `{value:spec}` fields.
    fn fstring(&mut self, parts: &'static [Expr], env: &mut Env) -> Result<String, Error> {
        let mut out = String::with_capacity(256);
        for p in parts {
            match p {
                Expr::Str { v } => out.push_str(v),
                Expr::Fmt { value, spec } => {
                    let v = self.eval(value, env)?;
                    match (spec, &v) {
                        // The common cases, without a temporary string.
                        (None, Value::Str(t)) => out.push_str(t),
                        (None, Value::Int(i)) => {
                            use std::fmt::Write as _;
                            // Writing into a String cannot fail.
                            let _ = write!(out, "{i}");
                        }
                        (None, _) => out.push_str(&v.format("")?),
                        (Some(parts), _) => {
                            let spec = self.fstring(parts, env)?;
                            out.push_str(&v.format(&spec)?);
                        }
                    }
                }
                other => return Err(format!("unexpected f-string part {other:?}")),
            }
        }
        Ok(out)
    }

    fn call(
        &mut self,
        func: &'static Expr,
        args: &'static [Expr],
        kwargs: &'static [(String, Expr)],
        env: &mut Env,
    ) -> Result<Value, Error> {
        // Methods on an object: evaluate the object, then the arguments, then dispatch.
        if let Expr::Attr { value, attr } = func {
            let obj = self.eval(value, env)?;
            if let Value::SelfObj = obj {
                let f = self.eval(func, env)?;
                let a = self.eval_all(args, env)?;
                let kw = self.eval_kwargs(kwargs, env)?;
                return self.call_value(f, a, kw);
            }
            let a = self.eval_all(args, env)?;
            let kw = self.eval_kwargs(kwargs, env)?;
            return self.method(obj, attr, a, kw);
        }
        if let Expr::Name { id } = func {
            if !env.contains_key(id.as_str()) && !self.globals.contains_key(id.as_str()) {
                let a = self.eval_all(args, env)?;
                let kw = self.eval_kwargs(kwargs, env)?;
                return builtin(id, a, kw);
            }
        }
        let f = self.eval(func, env)?;
        let a = self.eval_all(args, env)?;
        let kw = self.eval_kwargs(kwargs, env)?;
        self.call_value(f, a, kw)
    }

    fn eval_kwargs(
        &mut self,
        kwargs: &'static [(String, Expr)],
        env: &mut Env,
    ) -> Result<Vec<(&'static str, Value)>, Error> {
        let mut out = Vec::with_capacity(kwargs.len());
        for (k, v) in kwargs {
            out.push((k.as_str(), self.eval(v, env)?));
        }
        Ok(out)
    }

    fn call_value(
        &mut self,
        f: Value,
        args: Vec<Value>,
        kwargs: Vec<(&'static str, Value)>,
    ) -> Result<Value, Error> {
        match f {
            Value::Method(name) => self.call_method(name, args, kwargs),
            Value::Lambda(l) => {
                if !args.is_empty() || !kwargs.is_empty() {
                    return Err("a lambda called with arguments".into());
                }
                let (body, captured) = &*l;
                let mut env = captured.clone();
                self.eval(body, &mut env)
            }
            other => Err(format!("{other:?} is not callable")),
        }
    }

    /// `obj.name(args)`, dispatched on the receiver's type.
    fn method(
        &mut self,
        obj: Value,
        name: &str,
        args: Vec<Value>,
        kwargs: Vec<(&'static str, Value)>,
    ) -> Result<Value, Error> {
        let done = match &obj {
            Value::Rng => self.rng_method(name, &args, &kwargs)?,
            Value::Str(t) => str_method(t, name, &args, kwargs)?,
            Value::Dict(d) => dict_method(d, name, &args)?,
            Value::List(l) => list_method(l, name, &args)?,
            _ => None,
        };
        done.ok_or_else(|| format!("method .{name}() of {obj:?} is not supported"))
    }

    /// `self._template_rng.name(args)`; `None` for a method the templates do not use.
    fn rng_method(
        &mut self,
        name: &str,
        args: &[Value],
        kwargs: &[(&'static str, Value)],
    ) -> Result<Option<Value>, Error> {
        let arg = |i: usize| nth_arg(args, i, ".", name);
        Ok(Some(match name {
            "choice" => {
                let seq = arg(0)?;
                let n = seq.len()?;
                if n == 0 {
                    return Err("choice from an empty sequence".into());
                }
                let i = self.rng.choice_index(n);
                index_of(seq, &Value::Int(i as i64))?
            }
            "randint" => {
                let (a, b) = (arg(0)?.as_int()?, arg(1)?.as_int()?);
                if a > b {
                    return Err(format!("randint({a}, {b}): empty range"));
                }
                Value::Int(self.rng.randint(a, b))
            }
            "random" => Value::Float(self.rng.random()),
            "uniform" => Value::Float(self.rng.uniform(arg(0)?.as_f64()?, arg(1)?.as_f64()?)),
            "sample" => {
                let population = arg(0)?;
                let n = population.len()?;
                let k = match args.get(1) {
                    Some(k) => k.as_int()?,
                    None => kwarg(kwargs, "k")?.as_int()?,
                };
                let k = usize::try_from(k).map_err(|_| "negative sample size".to_string())?;
                if k > n {
                    return Err("sample larger than population".into());
                }
                let picked = self
                    .rng
                    .sample_indices(n, k)
                    .into_iter()
                    .map(|i| index_of(population, &Value::Int(i as i64)))
                    .collect::<Result<Vec<_>, _>>()?;
                Value::List(Rc::new(RefCell::new(picked)))
            }
            _ => return Ok(None),
        }))
    }
}

/// Argument `i` of a call, or an error naming the call (`prefix` is `"."` for a method).
fn nth_arg<'a>(args: &'a [Value], i: usize, prefix: &str, name: &str) -> Result<&'a Value, Error> {
    args.get(i)
        .ok_or_else(|| format!("{prefix}{name}() is missing argument {i}"))
}

/// `str` methods; `None` for one the templates do not use.
fn str_method(
    t: &str,
    name: &str,
    args: &[Value],
    kwargs: Vec<(&'static str, Value)>,
) -> Result<Option<Value>, Error> {
    let arg = |i: usize| nth_arg(args, i, ".", name);
    Ok(Some(match name {
        "title" => s(&pyfmt::title(t)),
        "lower" => s(&t.to_lowercase()),
        "upper" => s(&t.to_uppercase()),
        "split" => {
            let parts: Vec<Value> = match args.first() {
                None | Some(Value::None) => t.split_whitespace().map(s).collect(),
                Some(sep) => t.split(sep.as_str()?).map(s).collect(),
            };
            Value::List(Rc::new(RefCell::new(parts)))
        }
        "join" => {
            let items = arg(0)?.items()?;
            let mut out = String::new();
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(t);
                }
                out.push_str(it.as_str()?);
            }
            s(&out)
        }
        "format" => {
            if !args.is_empty() {
                return Err("str.format with positional arguments".into());
            }
            let map: Vec<(Value, Value)> = kwargs.into_iter().map(|(k, v)| (s(k), v)).collect();
            s(&format_template(t, &map, false)?)
        }
        "format_map" => match arg(0)? {
            Value::SafeMap(d) => s(&format_template(t, d, true)?),
            Value::Dict(d) => s(&format_template(t, d, false)?),
            other => return Err(format!("format_map({other:?})")),
        },
        _ => return Ok(None),
    }))
}

/// `dict` methods; `None` for one the templates do not use.
fn dict_method(d: &[(Value, Value)], name: &str, args: &[Value]) -> Result<Option<Value>, Error> {
    let arg = |i: usize| nth_arg(args, i, ".", name);
    Ok(Some(match name {
        "get" => {
            let default = args.get(1).cloned().unwrap_or(Value::None);
            dict_get(d, arg(0)?).cloned().unwrap_or(default)
        }
        "values" => Value::List(Rc::new(RefCell::new(
            d.iter().map(|(_, v)| v.clone()).collect(),
        ))),
        _ => return Ok(None),
    }))
}

/// `list` methods; `None` for one the templates do not use.
fn list_method(
    l: &RefCell<Vec<Value>>,
    name: &str,
    args: &[Value],
) -> Result<Option<Value>, Error> {
    let arg = |i: usize| nth_arg(args, i, ".", name);
    Ok(Some(match name {
        "append" => {
            l.borrow_mut().push(arg(0)?.clone());
            Value::None
        }
        "extend" => {
            let more = arg(0)?.items()?;
            l.borrow_mut().extend(more);
            Value::None
        }
        _ => return Ok(None),
    }))
}

fn kwarg<'a>(kwargs: &'a [(&'static str, Value)], name: &str) -> Result<&'a Value, Error> {
    kwargs
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .ok_or_else(|| format!("missing argument {name}"))
}

/// `str.format` / `format_map` over `map`; with `safe`, a missing key stays `{key}`.
fn format_template(t: &str, map: &[(Value, Value)], safe: bool) -> Result<String, Error> {
    let mut out = String::with_capacity(t.len() + 32);
    for p in pyfmt::parse_template(t)? {
        match p {
            Piece::Text(x) => out.push_str(x),
            Piece::Field { name, spec } => match dict_get(map, &s(name)) {
                Some(v) => out.push_str(&v.format(spec)?),
                None if safe => out.push_str(&s(&format!("{{{name}}}")).format(spec)?),
                None => return Err(format!("KeyError {name:?} formatting {t:?}")),
            },
        }
    }
    Ok(out)
}

fn names(t: &'static Expr, f: &mut dyn FnMut(&'static str)) {
    match t {
        Expr::Name { id } => f(id.as_str()),
        Expr::Tuple { elts } | Expr::List { elts } => elts.iter().for_each(|e| names(e, f)),
        _ => {}
    }
}

fn bind(t: &'static Expr, v: Value, env: &mut Env) -> Result<(), Error> {
    match t {
        Expr::Name { id } => {
            env.insert(id.as_str(), v);
            Ok(())
        }
        Expr::Tuple { elts } | Expr::List { elts } => {
            let items = v.items()?;
            if items.len() != elts.len() {
                return Err(format!(
                    "cannot unpack {} values into {}",
                    items.len(),
                    elts.len()
                ));
            }
            for (e, it) in elts.iter().zip(items) {
                bind(e, it, env)?;
            }
            Ok(())
        }
        other => Err(format!("cannot assign to {other:?}")),
    }
}

fn index_of(c: &Value, i: &Value) -> Result<Value, Error> {
    let seq = |len: usize| -> Result<usize, Error> {
        let k = i.as_int()?;
        let k = if k < 0 { k + len as i64 } else { k };
        usize::try_from(k)
            .ok()
            .filter(|&k| k < len)
            .ok_or_else(|| "index out of range".to_string())
    };
    Ok(match c {
        Value::List(l) => {
            let l = l.borrow();
            l[seq(l.len())?].clone()
        }
        Value::Tuple(t) => t[seq(t.len())?].clone(),
        Value::Str(t) => {
            let chars: Vec<char> = t.chars().collect();
            s(chars[seq(chars.len())?].encode_utf8(&mut [0; 4]))
        }
        Value::Dict(d) | Value::SafeMap(d) => dict_get(d, i)
            .cloned()
            .ok_or_else(|| format!("KeyError {i:?}"))?,
        other => return Err(format!("{other:?} is not subscriptable")),
    })
}

fn binop(op: &str, a: &Value, b: &Value) -> Result<Value, Error> {
    use Value::{Float, Int, List, Str, Tuple};
    Ok(match (op, a, b) {
        ("+", Str(x), Str(y)) => s(&format!("{}{}", &**x, &**y)),
        ("+", List(x), List(y)) => {
            let mut v = x.borrow().clone();
            v.extend(y.borrow().iter().cloned());
            List(Rc::new(RefCell::new(v)))
        }
        ("+", Tuple(x), Tuple(y)) => Tuple(Rc::new(x.iter().chain(y.iter()).cloned().collect())),
        ("*", Str(x), n) | ("*", n, Str(x)) if !matches!(n, Str(_)) => {
            s(&x.repeat(usize::try_from(n.as_int()?).unwrap_or(0)))
        }
        ("/", x, y) => {
            let d = y.as_f64()?;
            if d == 0.0 {
                return Err("division by zero".into());
            }
            Float(x.as_f64()? / d)
        }
        (op, Float(_), _) | (op, _, Float(_)) => {
            let (x, y) = (a.as_f64()?, b.as_f64()?);
            Float(match op {
                "+" => x + y,
                "-" => x - y,
                "*" => x * y,
                "//" => (x / y).floor(),
                _ => return Err(format!("float operator {op}")),
            })
        }
        (op, _, _) => {
            let (x, y) = (a.as_int()?, b.as_int()?);
            Int(match op {
                "+" => x + y,
                "-" => x - y,
                "*" => x * y,
                "//" if y != 0 => x.div_euclid(y) - i64::from(y < 0 && x.rem_euclid(y) != 0),
                "%" if y != 0 => {
                    x - y * (x.div_euclid(y) - i64::from(y < 0 && x.rem_euclid(y) != 0))
                }
                _ => return Err(format!("int operator {op} on {x}, {y}")),
            })
        }
    })
}

fn compare(op: &str, a: &Value, b: &Value) -> Result<bool, Error> {
    Ok(match op {
        "==" => py_eq(a, b),
        "!=" => !py_eq(a, b),
        "is" => {
            matches!((a, b), (Value::None, Value::None))
                || py_eq(a, b) && matches!(a, Value::Bool(_))
        }
        "is not" => !compare("is", a, b)?,
        "in" | "not in" => {
            let found = match (a, b) {
                (Value::Str(x), Value::Str(y)) => y.contains(&**x),
                (x, c) => c.items()?.iter().any(|it| py_eq(it, x)),
            };
            found == (op == "in")
        }
        _ => {
            let ord = match (a, b) {
                (Value::Str(x), Value::Str(y)) => (**x).cmp(&**y),
                _ => a
                    .as_f64()?
                    .partial_cmp(&b.as_f64()?)
                    .ok_or("comparison with NaN")?,
            };
            match op {
                "<" => ord.is_lt(),
                "<=" => ord.is_le(),
                ">" => ord.is_gt(),
                ">=" => ord.is_ge(),
                _ => return Err(format!("comparison {op}")),
            }
        }
    })
}

fn builtin(
    name: &str,
    args: Vec<Value>,
    kwargs: Vec<(&'static str, Value)>,
) -> Result<Value, Error> {
    let list = |v: Vec<Value>| Value::List(Rc::new(RefCell::new(v)));
    let arg = |i: usize| nth_arg(&args, i, "", name);
    Ok(match name {
        "len" => Value::Int(arg(0)?.len()? as i64),
        "min" => extreme(name, &args, false)?,
        "max" => extreme(name, &args, true)?,
        "sum" => {
            let mut acc = Value::Int(0);
            for it in arg(0)?.items()? {
                acc = binop("+", &acc, &it)?;
            }
            acc
        }
        "list" => list(arg(0)?.items()?),
        "tuple" => Value::Tuple(Rc::new(arg(0)?.items()?)),
        "range" => list(range(name, &args)?),
        "enumerate" => {
            let start = match args.get(1) {
                Some(v) => v.as_int()?,
                None => kwarg(&kwargs, "start").map_or(Ok(0), Value::as_int)?,
            };
            list(
                arg(0)?
                    .items()?
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| Value::Tuple(Rc::new(vec![Value::Int(start + i as i64), v])))
                    .collect(),
            )
        }
        "str" => s(&arg(0)?.to_str()?),
        "int" => match arg(0)? {
            Value::Float(f) => Value::Int(f.trunc() as i64),
            Value::Str(t) => Value::Int(t.trim().parse().map_err(|_| format!("int({t:?})"))?),
            other => Value::Int(other.as_int()?),
        },
        "_SafeFormatMap" => match arg(0)? {
            Value::Dict(d) | Value::SafeMap(d) => Value::SafeMap(d.clone()),
            other => return Err(format!("_SafeFormatMap({other:?})")),
        },
        other => return Err(format!("builtin {other}() is not supported")),
    })
}

/// `min(...)` / `max(...)` over one iterable or over the arguments; the first of equals wins.
fn extreme(name: &str, args: &[Value], want_max: bool) -> Result<Value, Error> {
    let items = if args.len() == 1 {
        args[0].items()?
    } else {
        args.to_vec()
    };
    let mut best: Option<Value> = None;
    for it in items {
        best = Some(match best {
            None => it,
            Some(b) => {
                let better = if want_max {
                    compare(">", &it, &b)?
                } else {
                    compare("<", &it, &b)?
                };
                if better {
                    it
                } else {
                    b
                }
            }
        });
    }
    best.ok_or_else(|| format!("{name}() of an empty sequence"))
}

/// `range(stop)`, `range(start, stop)`, `range(start, stop, step)`, as a list.
fn range(name: &str, args: &[Value]) -> Result<Vec<Value>, Error> {
    let arg = |i: usize| nth_arg(args, i, "", name);
    let (start, stop, step) = match args.len() {
        1 => (0, arg(0)?.as_int()?, 1),
        2 => (arg(0)?.as_int()?, arg(1)?.as_int()?, 1),
        _ => (arg(0)?.as_int()?, arg(1)?.as_int()?, arg(2)?.as_int()?),
    };
    if step == 0 {
        return Err("range() step is 0".into());
    }
    let mut v = Vec::new();
    let mut i = start;
    while (step > 0 && i < stop) || (step < 0 && i > stop) {
        v.push(Value::Int(i));
        i += step;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asset_loads_and_names_every_generator() {
        let t = templates();
        assert_eq!(t.aiperf_version, "0.13.0");
        let total: usize = t.tool_pool_block_counts.iter().map(|(_, n)| n).sum();
        assert_eq!(total, 790);
        for (name, _) in &t.tool_pool_block_counts {
            assert!(t.methods.contains_key(name), "{name}");
        }
        assert!(t.methods.contains_key("_gen_user_prompt"));
    }

    #[test]
    fn every_generator_runs() {
        let mut rng = PyRandom::new(1);
        let mut it = Interp::new(&mut rng);
        for (name, _) in &templates().tool_pool_block_counts {
            for _ in 0..20 {
                let text = it.generate(name).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(!text.is_empty(), "{name}");
            }
        }
    }
}
