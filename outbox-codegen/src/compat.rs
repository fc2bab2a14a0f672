//! Compatibility classification between two versions of a payload schema.
//!
//! Words as in schema registries: a change is **backward** compatible when
//! new readers can read data written with the old schema, **forward**
//! compatible when old readers can read data written with the new schema,
//! **full** when both, **breaking** when neither. Each change found gets its
//! own pair of answers; the whole diff is the weakest of them. The rules,
//! with serde's behaviour in mind (unknown fields are ignored unless the
//! type says `deny_unknown_fields`, which schemars writes as
//! `additionalProperties: false`), are listed in the README of this crate
//! and tested one by one.
//!
//! This file walks two schemas side by side (resolving `$ref` into `$defs`)
//! and reports changes with the logical path of the field concerned
//! (`/properties/lines/items/properties/sku`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The compatibility class of a set of changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compatibility {
    /// Backward and forward compatible (or no change at all).
    Full,
    /// New readers read old data; old readers may fail on new data.
    Backward,
    /// Old readers read new data; new readers may fail on old data.
    Forward,
    /// Neither direction is safe.
    Breaking,
}

impl Compatibility {
    fn from_flags(backward: bool, forward: bool) -> Compatibility {
        match (backward, forward) {
            (true, true) => Compatibility::Full,
            (true, false) => Compatibility::Backward,
            (false, true) => Compatibility::Forward,
            (false, false) => Compatibility::Breaking,
        }
    }

    /// Whether new readers can read old data (what an upcaster otherwise provides).
    pub fn is_backward(self) -> bool {
        matches!(self, Compatibility::Full | Compatibility::Backward)
    }
}

impl fmt::Display for Compatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compatibility::Full => "full",
            Compatibility::Backward => "backward",
            Compatibility::Forward => "forward",
            Compatibility::Breaking => "breaking",
        })
    }
}

/// One change between two schemas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Logical path of the place that changed.
    pub path: String,
    /// The rule that classified it (`field-added-optional`, `likely-rename`,
    /// `keyword-unknown`, …; the README's table lists them all).
    pub rule: &'static str,
    /// What changed, in words, naming the field.
    pub description: String,
    /// New readers can read old data despite this change.
    pub backward: bool,
    /// Old readers can read new data despite this change.
    pub forward: bool,
}

impl Change {
    /// The class of this single change.
    pub fn compatibility(&self) -> Compatibility {
        Compatibility::from_flags(self.backward, self.forward)
    }
}

/// All changes between two schemas and their overall class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Classification {
    /// Every change, in walk order (properties sorted by name).
    pub changes: Vec<Change>,
}

impl Classification {
    /// The weakest class over all changes (`Full` when nothing changed).
    pub fn compatibility(&self) -> Compatibility {
        let backward = self.changes.iter().all(|c| c.backward);
        let forward = self.changes.iter().all(|c| c.forward);
        Compatibility::from_flags(backward, forward)
    }

    /// A short list of the changes for one report line.
    pub fn describe(&self) -> String {
        if self.changes.is_empty() {
            return "no contract change".to_owned();
        }
        self.changes
            .iter()
            .map(|c| format!("{} [{}]", c.description, c.compatibility()))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Classifies the change from `old` to `new` (two JSON Schemas).
///
/// A `$ref` with sibling keywords (draft 2020-12 applies both; schemars
/// writes the tag of an internally tagged enum's newtype variant that way)
/// is read as the referenced schema with the siblings merged in.
pub fn classify(old: &Value, new: &Value) -> Classification {
    let old = merge_ref_siblings(old);
    let new = merge_ref_siblings(new);
    let mut walker = Walker {
        old_root: &old,
        new_root: &new,
        visited: HashSet::new(),
        changes: Vec::new(),
    };
    walker.compare(&old, &new, String::new());
    Classification {
        changes: walker.changes,
    }
}

/// Keywords that identify a schema or carry content hints without
/// constraining data (draft 2020-12's core identifiers and content
/// vocabulary): not a contract change either.
const NON_VALIDATING: &[&str] = &[
    "$anchor",
    "$dynamicAnchor",
    "$vocabulary",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
];

/// Keywords the walker reads through `Shape` or walks into; everything
/// else is compared by `compare_keywords`.
const STRUCTURAL: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "format",
    "minimum",
    "maximum",
    "default",
    "anyOf",
    "oneOf",
    "$ref",
    "$defs",
    "definitions",
];

/// Every `{"$ref": …, <other keywords>}` becomes the referenced schema with
/// those keywords merged in (properties and `required` joined, the
/// siblings winning elsewhere), everywhere in the document.
fn merge_ref_siblings(root: &Value) -> Value {
    fn walk(root: &Value, node: &Value, depth: usize) -> Value {
        match node {
            Value::Object(map) if depth < 64 => {
                let has_siblings = map.contains_key("$ref")
                    && map
                        .keys()
                        .any(|k| k != "$ref" && !ANNOTATIONS.contains(&k.as_str()));
                let mut merged: Map<String, Value> = if has_siblings {
                    let target = map
                        .get("$ref")
                        .and_then(Value::as_str)
                        .and_then(|r| r.strip_prefix('#'))
                        .and_then(|pointer| root.pointer(pointer));
                    match target {
                        Some(Value::Object(target)) => {
                            let mut merged = target.clone();
                            for (key, value) in map {
                                if key == "$ref" {
                                    continue;
                                }
                                match (key.as_str(), merged.get_mut(key), value) {
                                    (
                                        "properties",
                                        Some(Value::Object(into)),
                                        Value::Object(from),
                                    ) => {
                                        for (name, schema) in from {
                                            into.insert(name.clone(), schema.clone());
                                        }
                                    }
                                    ("required", Some(Value::Array(into)), Value::Array(from)) => {
                                        for name in from {
                                            if !into.contains(name) {
                                                into.push(name.clone());
                                            }
                                        }
                                    }
                                    _ => {
                                        merged.insert(key.clone(), value.clone());
                                    }
                                }
                            }
                            merged
                        }
                        _ => map.clone(),
                    }
                } else {
                    map.clone()
                };
                for value in merged.values_mut() {
                    *value = walk(root, value, depth + 1);
                }
                Value::Object(merged)
            }
            Value::Array(items) if depth < 64 => {
                Value::Array(items.iter().map(|v| walk(root, v, depth + 1)).collect())
            }
            other => other.clone(),
        }
    }
    walk(root, root, 0)
}

/// Keywords that document or identify a schema without constraining data
/// (`$id` is the URI producers put in `dataschema`: not the contract).
pub(crate) const ANNOTATIONS: &[&str] = &[
    "$comment",
    "$id",
    "$schema",
    "deprecated",
    "description",
    "examples",
    "readOnly",
    "title",
    "writeOnly",
];

/// The schema with annotation keywords removed at every schema position
/// (property names that happen to be called `description` stay).
pub fn strip_annotations(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                if ANNOTATIONS.contains(&key.as_str()) {
                    continue;
                }
                let value = match key.as_str() {
                    "properties" | "$defs" | "definitions" | "patternProperties"
                    | "dependentSchemas" => match value {
                        Value::Object(children) => Value::Object(
                            children
                                .iter()
                                .map(|(name, child)| (name.clone(), strip_annotations(child)))
                                .collect(),
                        ),
                        other => other.clone(),
                    },
                    "items"
                    | "additionalProperties"
                    | "not"
                    | "if"
                    | "then"
                    | "else"
                    | "contains"
                    | "propertyNames"
                    | "unevaluatedProperties"
                    | "unevaluatedItems"
                    | "additionalItems" => strip_annotations(value),
                    "anyOf" | "oneOf" | "allOf" | "prefixItems" => match value {
                        Value::Array(items) => {
                            Value::Array(items.iter().map(strip_annotations).collect())
                        }
                        other => other.clone(),
                    },
                    _ => value.clone(),
                };
                out.insert(key.clone(), value);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// The first place where two JSON values differ, as a JSON pointer with the
/// two values found there (`None` when one side lacks the key).
pub fn first_difference(
    old: &Value,
    new: &Value,
) -> Option<(String, Option<Value>, Option<Value>)> {
    fn walk(
        old: &Value,
        new: &Value,
        pointer: &mut String,
    ) -> Option<(String, Option<Value>, Option<Value>)> {
        match (old, new) {
            (Value::Object(a), Value::Object(b)) => {
                let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for key in keys {
                    let length = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    let found = match (a.get(key), b.get(key)) {
                        (Some(x), Some(y)) => walk(x, y, pointer),
                        (x, y) => Some((pointer.clone(), x.cloned(), y.cloned())),
                    };
                    if found.is_some() {
                        return found;
                    }
                    pointer.truncate(length);
                }
                None
            }
            (Value::Array(a), Value::Array(b)) => {
                for index in 0..a.len().max(b.len()) {
                    let length = pointer.len();
                    pointer.push_str(&format!("/{index}"));
                    let found = match (a.get(index), b.get(index)) {
                        (Some(x), Some(y)) => walk(x, y, pointer),
                        (x, y) => Some((pointer.clone(), x.cloned(), y.cloned())),
                    };
                    if found.is_some() {
                        return found;
                    }
                    pointer.truncate(length);
                }
                None
            }
            (a, b) if a == b => None,
            (a, b) => Some((pointer.clone(), Some(a.clone()), Some(b.clone()))),
        }
    }
    let mut pointer = String::new();
    walk(old, new, &mut pointer)
        .map(|(p, a, b)| (if p.is_empty() { "/".to_owned() } else { p }, a, b))
}

struct Walker<'a> {
    old_root: &'a Value,
    new_root: &'a Value,
    visited: HashSet<(String, String)>,
    changes: Vec<Change>,
}

/// A number as a schema states it: integers exactly (`i64::MAX` stays
/// 9223372036854775807), everything else as a float.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn from_json(value: &Value) -> Option<Num> {
        if let Some(i) = value.as_i64() {
            Some(Num::Int(i128::from(i)))
        } else if let Some(u) = value.as_u64() {
            Some(Num::Int(i128::from(u)))
        } else {
            value.as_f64().map(Num::Float)
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

impl PartialOrd for Num {
    fn partial_cmp(&self, other: &Num) -> Option<std::cmp::Ordering> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a.partial_cmp(b),
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => write!(f, "{x}"),
        }
    }
}

/// What a schema node says, with the patterns schemars writes flattened:
/// `anyOf [X, {"type":"null"}]` is X plus null, `oneOf` of consts is an enum.
#[derive(Default)]
struct Shape<'a> {
    /// Allowed JSON types; empty means any.
    types: BTreeSet<String>,
    /// Allowed values (`enum`/`const`), if restricted.
    values: Option<Vec<Value>>,
    properties: BTreeMap<&'a str, &'a Value>,
    required: BTreeSet<&'a str>,
    is_object: bool,
    additional: Additional<'a>,
    items: Option<&'a Value>,
    format: Option<&'a str>,
    minimum: Option<Num>,
    maximum: Option<Num>,
    default: Option<&'a Value>,
    alternatives: Vec<&'a Value>,
    never: bool,
}

#[derive(Default, Clone, Copy)]
enum Additional<'a> {
    #[default]
    Allowed,
    Denied,
    Schema(&'a Value),
}

impl Additional<'_> {
    fn allows_unknown(self) -> bool {
        !matches!(self, Additional::Denied)
    }
}

impl<'a> Walker<'a> {
    fn push(
        &mut self,
        path: &str,
        rule: &'static str,
        description: String,
        backward: bool,
        forward: bool,
    ) {
        self.changes.push(Change {
            path: if path.is_empty() {
                "/".to_owned()
            } else {
                path.to_owned()
            },
            rule,
            description,
            backward,
            forward,
        });
    }

    /// A change after which the new schema accepts less (`tightened`) or
    /// more than the old one.
    fn bound(&mut self, path: &str, rule: &'static str, description: String, tightened: bool) {
        self.push(path, rule, description, !tightened, tightened);
    }

    fn resolve(root: &'a Value, mut node: &'a Value) -> (&'a Value, Option<String>) {
        let mut reference = None;
        for _ in 0..32 {
            let Some(target) = node.get("$ref").and_then(Value::as_str) else {
                break;
            };
            let Some(found) = target
                .strip_prefix('#')
                .and_then(|pointer| root.pointer(pointer))
            else {
                break;
            };
            reference = Some(target.to_owned());
            node = found;
        }
        (node, reference)
    }

    fn shape(root: &'a Value, node: &'a Value) -> Shape<'a> {
        let (node, _) = Self::resolve(root, node);
        let mut shape = Shape::default();
        let Value::Object(map) = node else {
            shape.never = node == &Value::Bool(false);
            return shape;
        };
        match map.get("type") {
            Some(Value::String(t)) => {
                shape.types.insert(t.clone());
            }
            Some(Value::Array(ts)) => {
                shape
                    .types
                    .extend(ts.iter().filter_map(Value::as_str).map(str::to_owned));
            }
            _ => {}
        }
        if let Some(Value::Array(values)) = map.get("enum") {
            shape.values = Some(values.clone());
        }
        if let Some(value) = map.get("const") {
            shape.values = Some(vec![value.clone()]);
        }
        if let Some(Value::Object(properties)) = map.get("properties") {
            shape.properties = properties.iter().map(|(k, v)| (k.as_str(), v)).collect();
            shape.is_object = true;
        }
        if let Some(Value::Array(required)) = map.get("required") {
            shape.required = required.iter().filter_map(Value::as_str).collect();
        }
        if shape.types.contains("object") {
            shape.is_object = true;
        }
        shape.additional = match map.get("additionalProperties") {
            Some(Value::Bool(false)) => Additional::Denied,
            Some(Value::Bool(true)) | None => Additional::Allowed,
            Some(schema) => Additional::Schema(schema),
        };
        shape.items = map.get("items");
        shape.format = map.get("format").and_then(Value::as_str);
        shape.minimum = map.get("minimum").and_then(Num::from_json);
        shape.maximum = map.get("maximum").and_then(Num::from_json);
        shape.default = map.get("default");
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alternatives)) = map.get(key) {
                Self::absorb_alternatives(root, alternatives, &mut shape);
            }
        }
        shape
    }

    /// Folds the schemars patterns for Option and unit enums into the shape;
    /// keeps anything else as alternatives.
    fn absorb_alternatives(root: &'a Value, alternatives: &'a [Value], shape: &mut Shape<'a>) {
        let resolved: Vec<&'a Value> = alternatives
            .iter()
            .map(|a| Self::resolve(root, a).0)
            .collect();
        let is_null = |v: &Value| {
            v.get("type") == Some(&Value::String("null".into()))
                && v.as_object().is_some_and(|m| m.len() == 1)
        };
        let consts: Option<Vec<Value>> = resolved
            .iter()
            .map(|alternative| alternative.get("const").cloned())
            .collect();
        if let Some(values) = consts {
            for alternative in &resolved {
                if let Some(t) = alternative.get("type").and_then(Value::as_str) {
                    shape.types.insert(t.to_owned());
                }
            }
            shape.values = Some(values);
            return;
        }
        let non_null: Vec<&'a Value> = alternatives
            .iter()
            .zip(&resolved)
            .filter(|(_, resolved)| !is_null(resolved))
            .map(|(original, _)| original)
            .collect();
        let has_null = non_null.len() < alternatives.len();
        if has_null && non_null.len() == 1 {
            // `Option<T>` of a derived type: T's shape plus null. An untyped T
            // (any value) already admits null.
            let mut inner = Self::shape(root, non_null[0]);
            if inner.default.is_none() {
                inner.default = shape.default;
            }
            if let Some(values) = &mut inner.values {
                values.push(Value::Null);
            }
            if !inner.types.is_empty() {
                inner.types.insert("null".to_owned());
            }
            *shape = inner;
            return;
        }
        shape.alternatives = alternatives.iter().collect();
    }

    fn compare(&mut self, old: &'a Value, new: &'a Value, path: String) {
        let (old_resolved, old_ref) = Self::resolve(self.old_root, old);
        let (new_resolved, new_ref) = Self::resolve(self.new_root, new);
        if let (Some(a), Some(b)) = (&old_ref, &new_ref)
            && !self.visited.insert((a.clone(), b.clone()))
        {
            return;
        }
        if strip_annotations(old_resolved) == strip_annotations(new_resolved)
            && !contains_ref(old_resolved)
        {
            return;
        }
        let old_shape = Self::shape(self.old_root, old_resolved);
        let new_shape = Self::shape(self.new_root, new_resolved);
        let field = field_name(&path);

        if old_shape.never != new_shape.never {
            let opened = old_shape.never;
            self.push(
                &path,
                if opened {
                    "schema-opened"
                } else {
                    "schema-closed"
                },
                format!(
                    "{field} {} every value",
                    if opened { "now accepts" } else { "now rejects" }
                ),
                opened,
                !opened,
            );
            return;
        }

        if !self.compare_types(&old_shape, &new_shape, &path, &field) {
            return;
        }
        self.compare_values(&old_shape, &new_shape, &path, &field);
        self.compare_format_and_range(&old_shape, &new_shape, &path, &field);
        self.compare_default(&old_shape, &new_shape, &path, &field);
        if old_shape.is_object || new_shape.is_object {
            self.compare_objects(&old_shape, &new_shape, &path);
        }
        match (old_shape.items, new_shape.items) {
            (Some(a), Some(b)) => self.compare(a, b, format!("{path}/items")),
            (None, Some(_)) => self.push(
                &format!("{path}/items"),
                "items-constrained",
                format!("{field}: array items now constrained"),
                false,
                true,
            ),
            (Some(_), None) => self.push(
                &format!("{path}/items"),
                "items-unconstrained",
                format!("{field}: array items no longer constrained"),
                true,
                false,
            ),
            (None, None) => {}
        }
        self.compare_alternatives(&old_shape, &new_shape, &path, &field);
        if let (Value::Object(old_map), Value::Object(new_map)) = (old_resolved, new_resolved) {
            self.compare_keywords(old_map, new_map, &path, &field);
        }
    }

    /// Returns false when the types are unrelated (no point looking deeper).
    fn compare_types(&mut self, old: &Shape<'_>, new: &Shape<'_>, path: &str, field: &str) -> bool {
        if old.types == new.types || (old.types.is_empty() && new.types.is_empty()) {
            return true;
        }
        let accepts = |set: &BTreeSet<String>, t: &str| {
            set.is_empty() || set.contains(t) || (t == "integer" && set.contains("number"))
        };
        // An empty set is "any type": going from any to some types narrows,
        // from some types to any widens (an empty `all` would say both).
        let widened = !old.types.is_empty() && old.types.iter().all(|t| accepts(&new.types, t));
        let narrowed = !new.types.is_empty() && new.types.iter().all(|t| accepts(&old.types, t));
        let from = type_list(&old.types);
        let to = type_list(&new.types);
        let only_null_added = !old.types.is_empty()
            && new.types.contains("null")
            && !old.types.contains("null")
            && new
                .types
                .iter()
                .filter(|t| *t != "null")
                .eq(old.types.iter());
        let only_null_removed = !new.types.is_empty()
            && old.types.contains("null")
            && !new.types.contains("null")
            && old
                .types
                .iter()
                .filter(|t| *t != "null")
                .eq(new.types.iter());
        if only_null_added {
            self.push(
                path,
                "became-nullable",
                format!("{field} became nullable ({from} → {to})"),
                true,
                false,
            );
            true
        } else if only_null_removed {
            self.push(
                path,
                "no-longer-nullable",
                format!("{field} is no longer nullable ({from} → {to})"),
                false,
                true,
            );
            true
        } else if widened {
            self.push(
                path,
                "type-widened",
                format!("{field}: type widened from {from} to {to}"),
                true,
                false,
            );
            true
        } else if narrowed {
            self.push(
                path,
                "type-narrowed",
                format!("{field}: type narrowed from {from} to {to}"),
                false,
                true,
            );
            true
        } else {
            self.push(
                path,
                "type-changed",
                format!("{field}: type changed from {from} to {to}"),
                false,
                false,
            );
            false
        }
    }

    fn compare_values(&mut self, old: &Shape<'_>, new: &Shape<'_>, path: &str, field: &str) {
        match (&old.values, &new.values) {
            (Some(a), Some(b)) => self.compare_value_sets(a, b, path, field),
            (Some(_), None) => self.push(
                path,
                "enum-restriction-removed",
                format!("{field}: no longer restricted to enum values"),
                true,
                false,
            ),
            (None, Some(_)) => self.push(
                path,
                "enum-restriction-added",
                format!("{field}: now restricted to enum values"),
                false,
                true,
            ),
            (None, None) => {}
        }
    }

    fn compare_value_sets(&mut self, old: &[Value], new: &[Value], path: &str, field: &str) {
        for value in new.iter().filter(|v| !old.contains(v)) {
            self.push(
                path,
                "enum-value-added",
                format!("{field}: enum value {value} added"),
                true,
                false,
            );
        }
        for value in old.iter().filter(|v| !new.contains(v)) {
            self.push(
                path,
                "enum-value-removed",
                format!("{field}: enum value {value} removed"),
                false,
                true,
            );
        }
    }

    fn compare_format_and_range(
        &mut self,
        old: &Shape<'_>,
        new: &Shape<'_>,
        path: &str,
        field: &str,
    ) {
        let old_range = numeric_range(old);
        let new_range = numeric_range(new);
        if old_range != new_range && (old_range.is_some() || new_range.is_some()) {
            let (lo_a, hi_a) = old_range.unwrap_or((None, None));
            let (lo_b, hi_b) = new_range.unwrap_or((None, None));
            let at_least = |a: Option<Num>, b: Option<Num>| match (a, b) {
                (_, None) => true,
                (None, Some(_)) => false,
                (Some(a), Some(b)) => a >= b,
            };
            // New covers old: new low ≤ old low and new high ≥ old high.
            let widened = at_least(lo_a, lo_b) && at_least(neg(hi_a), neg(hi_b));
            let narrowed = at_least(lo_b, lo_a) && at_least(neg(hi_b), neg(hi_a));
            // Name the formats; when both have the same one (only `minimum`
            // or `maximum` changed), the bounds say what changed.
            let (from, to) = if old.format == new.format {
                (bounds_text(lo_a, hi_a), bounds_text(lo_b, hi_b))
            } else {
                (
                    format_or_bounds(old.format, lo_a, hi_a),
                    format_or_bounds(new.format, lo_b, hi_b),
                )
            };
            let (rule, description) = if widened {
                (
                    "range-widened",
                    format!("{field}: numeric range widened ({from} → {to})"),
                )
            } else if narrowed {
                (
                    "range-narrowed",
                    format!("{field}: numeric range narrowed ({from} → {to})"),
                )
            } else {
                (
                    "range-changed",
                    format!("{field}: numeric range changed ({from} → {to})"),
                )
            };
            self.push(path, rule, description, widened, narrowed);
            return;
        }
        if integer_format_range(old.format).is_some() || integer_format_range(new.format).is_some()
        {
            return;
        }
        match (old.format, new.format) {
            (Some("float"), Some("double")) => self.push(
                path,
                "float-widened",
                format!(
                    "{field}: f32 → f64 (format float → double): new readers read every old value; old f32 readers read values beyond ±3.4e38 as ±infinity and round the rest to f32 precision"
                ),
                true,
                false,
            ),
            (Some("double"), Some("float")) => self.push(
                path,
                "float-narrowed",
                format!(
                    "{field}: f64 → f32 (format double → float): new f32 readers read old values beyond ±3.4e38 as ±infinity and round the rest; old readers read every new value"
                ),
                false,
                true,
            ),
            (Some(a), Some(b)) if a != b => self.push(
                path,
                "format-changed",
                format!("{field}: format changed from {a} to {b}"),
                false,
                false,
            ),
            (Some(a), None) => self.push(
                path,
                "format-removed",
                format!("{field}: format {a} no longer required"),
                true,
                false,
            ),
            (None, Some(b)) => self.push(
                path,
                "format-added",
                format!("{field}: format {b} now required"),
                false,
                true,
            ),
            _ => {}
        }
    }

    /// `default` is an annotation to JSON Schema, but serde fills it in for
    /// a missing field: a reader with another default reads old data
    /// differently. Both directions still read; the change is reported.
    fn compare_default(&mut self, old: &Shape<'_>, new: &Shape<'_>, path: &str, field: &str) {
        if path.is_empty() {
            return;
        }
        match (old.default, new.default) {
            (Some(a), Some(b)) if a != b => self.push(
                path,
                "default-changed",
                format!(
                    "{field}: default changed from {a} to {b} (readers fill in the new value for data without the field)"
                ),
                true,
                true,
            ),
            _ => {}
        }
    }

    fn compare_objects(&mut self, old: &Shape<'a>, new: &Shape<'a>, path: &str) {
        let removed: Vec<&str> = old
            .properties
            .keys()
            .filter(|k| !new.properties.contains_key(*k))
            .copied()
            .collect();
        let added: Vec<&str> = new
            .properties
            .keys()
            .filter(|k| !old.properties.contains_key(*k))
            .copied()
            .collect();
        // A field removed and one of the same schema added in the same
        // version: in practice a rename, whose values silently never reach
        // the other side.
        let mut renamed: Vec<(&str, &str)> = Vec::new();
        for gone in &removed {
            let old_schema = strip_annotations(old.properties[gone]);
            let candidates: Vec<&str> = added
                .iter()
                .filter(|a| !renamed.iter().any(|(_, taken)| taken == *a))
                .filter(|a| strip_annotations(new.properties[*a]) == old_schema)
                .copied()
                .collect();
            if candidates.len() == 1 {
                renamed.push((gone, candidates[0]));
            }
        }
        let names: BTreeSet<&str> = old
            .properties
            .keys()
            .chain(new.properties.keys())
            .copied()
            .collect();
        for name in names {
            let child_path = format!("{path}/properties/{name}");
            match (old.properties.get(name), new.properties.get(name)) {
                (Some(a), Some(b)) => {
                    let was_required = old.required.contains(name);
                    let is_required = new.required.contains(name);
                    if was_required && !is_required {
                        self.push(
                            &child_path,
                            "field-became-optional",
                            format!("field `{name}` became optional"),
                            true,
                            false,
                        );
                    } else if !was_required && is_required {
                        self.push(
                            &child_path,
                            "field-became-required",
                            format!("field `{name}` became required"),
                            false,
                            true,
                        );
                    }
                    self.compare(a, b, child_path);
                }
                (None, Some(schema)) => {
                    if let Some((from, _)) = renamed.iter().find(|(_, to)| *to == name) {
                        self.push(
                            &child_path,
                            "likely-rename",
                            format!(
                                "likely rename of field `{from}` to `{name}` (one field removed and one of the same schema added): new readers never see values written as `{from}`, old readers never see `{name}`; map it in an upcaster"
                            ),
                            false,
                            false,
                        );
                        continue;
                    }
                    let has_default = schema.get("default").is_some();
                    let required = new.required.contains(name) && !has_default;
                    let forward = old.additional.allows_unknown();
                    if required {
                        self.push(
                            &child_path,
                            "field-added-required",
                            format!("required field `{name}` added"),
                            false,
                            forward,
                        );
                    } else if has_default {
                        self.push(
                            &child_path,
                            "field-added-with-default",
                            format!("field `{name}` added with a default"),
                            true,
                            forward,
                        );
                    } else {
                        self.push(
                            &child_path,
                            "field-added-optional",
                            format!("optional field `{name}` added"),
                            true,
                            forward,
                        );
                    }
                }
                (Some(_), None) => {
                    if renamed.iter().any(|(from, _)| *from == name) {
                        continue;
                    }
                    let backward = new.additional.allows_unknown();
                    let forward = !old.required.contains(name);
                    let (rule, kind) = if old.required.contains(name) {
                        ("field-removed-required", "required")
                    } else {
                        ("field-removed-optional", "optional")
                    };
                    self.push(
                        &child_path,
                        rule,
                        format!("{kind} field `{name}` removed"),
                        backward,
                        forward,
                    );
                }
                (None, None) => {}
            }
        }
        let location = format!("{path}/additionalProperties");
        // `field_name` already quotes: "field `total`", "the payload".
        let what = field_name(path);
        match (old.additional, new.additional) {
            (Additional::Allowed, Additional::Denied) => self.push(
                &location,
                "object-closed",
                format!("{what} no longer accepts unknown fields (additionalProperties: false)"),
                false,
                true,
            ),
            (Additional::Denied, Additional::Allowed) => self.push(
                &location,
                "object-opened",
                format!("{what} now accepts unknown fields"),
                true,
                false,
            ),
            (Additional::Schema(a), Additional::Schema(b)) => self.compare(a, b, location),
            (Additional::Schema(_), Additional::Allowed) => self.push(
                &location,
                "unknown-fields-unconstrained",
                format!("{what}: unknown fields no longer constrained"),
                true,
                false,
            ),
            (Additional::Allowed, Additional::Schema(_)) => self.push(
                &location,
                "unknown-fields-constrained",
                format!("{what}: unknown fields now constrained"),
                false,
                true,
            ),
            (Additional::Schema(_), Additional::Denied) => self.push(
                &location,
                "object-closed",
                format!("{what} no longer accepts unknown fields"),
                false,
                true,
            ),
            (Additional::Denied, Additional::Schema(_)) => self.push(
                &location,
                "object-opened",
                format!("{what} now accepts some unknown fields"),
                true,
                false,
            ),
            (Additional::Allowed, Additional::Allowed)
            | (Additional::Denied, Additional::Denied) => {}
        }
    }

    fn compare_alternatives(&mut self, old: &Shape<'a>, new: &Shape<'a>, path: &str, field: &str) {
        if old.alternatives.is_empty() && new.alternatives.is_empty() {
            return;
        }
        let old_root = self.old_root;
        let new_root = self.new_root;
        // The unit variants of an enum that also has data variants: schemars
        // writes them as one `enum` alternative (or one `const` each). Their
        // values are one set on each side.
        let old_values = value_alternatives(old_root, &old.alternatives);
        let new_values = value_alternatives(new_root, &new.alternatives);
        if !old_values.is_empty() || !new_values.is_empty() {
            let old_set: Vec<Value> = old_values.iter().flat_map(|(_, v)| v.clone()).collect();
            let new_set: Vec<Value> = new_values.iter().flat_map(|(_, v)| v.clone()).collect();
            self.compare_value_sets(&old_set, &new_set, path, field);
        }
        let old_rest: Vec<&'a Value> = old
            .alternatives
            .iter()
            .enumerate()
            .filter(|(i, _)| !old_values.iter().any(|(j, _)| j == i))
            .map(|(_, v)| *v)
            .collect();
        let mut unmatched_new: Vec<&'a Value> = new
            .alternatives
            .iter()
            .enumerate()
            .filter(|(i, _)| !new_values.iter().any(|(j, _)| j == i))
            .map(|(_, v)| *v)
            .collect();
        let key = |root: &'a Value, v: &'a Value| discriminator(Self::resolve(root, v).0);
        for (index, alternative) in old_rest.iter().enumerate() {
            let stripped = strip_annotations(Self::resolve(old_root, alternative).0);
            if let Some(position) = unmatched_new
                .iter()
                .position(|n| strip_annotations(Self::resolve(new_root, n).0) == stripped)
            {
                unmatched_new.remove(position);
                continue;
            }
            let tag = key(old_root, alternative);
            if let Some(position) = unmatched_new
                .iter()
                .position(|n| tag.is_some() && key(new_root, n) == tag)
            {
                let counterpart = unmatched_new.remove(position);
                let label = tag.clone().unwrap_or_else(|| index.to_string());
                self.compare(alternative, counterpart, format!("{path}/oneOf/{label}"));
                continue;
            }
            let label = tag.unwrap_or_else(|| index.to_string());
            self.push(
                path,
                "variant-removed",
                format!("{field}: variant {label} removed"),
                false,
                true,
            );
        }
        for alternative in unmatched_new {
            let label = key(new_root, alternative).unwrap_or_else(|| "(unnamed)".to_owned());
            self.push(
                path,
                "variant-added",
                format!("{field}: variant {label} added"),
                true,
                false,
            );
        }
    }

    /// Every other keyword of draft 2020-12: bounds of length, size and
    /// count, `multipleOf`, `pattern`, `uniqueItems`, `prefixItems`,
    /// `contains`; a keyword this checker does not classify is a change a
    /// human must judge (treated as breaking), named with its path.
    fn compare_keywords(
        &mut self,
        old: &'a Map<String, Value>,
        new: &'a Map<String, Value>,
        path: &str,
        field: &str,
    ) {
        let keys: BTreeSet<&'a str> = old
            .keys()
            .chain(new.keys())
            .map(String::as_str)
            .filter(|k| {
                !ANNOTATIONS.contains(k) && !NON_VALIDATING.contains(k) && !STRUCTURAL.contains(k)
            })
            .collect();
        for key in keys {
            let (a, b) = (old.get(key), new.get(key));
            if a == b {
                continue;
            }
            let at = format!("{path}/{key}");
            match key {
                "minLength" | "minItems" | "minProperties" | "minContains" | "exclusiveMinimum" => {
                    self.lower_bound(&at, key, field, a, b)
                }
                "maxLength" | "maxItems" | "maxProperties" | "maxContains" | "exclusiveMaximum" => {
                    self.upper_bound(&at, key, field, a, b)
                }
                "multipleOf" => self.multiple_of(&at, field, a, b),
                "pattern" => match (a, b) {
                    (None, Some(b)) => self.bound(
                        &at,
                        "pattern-added",
                        format!("{field}: pattern {b} now required"),
                        true,
                    ),
                    (Some(a), None) => self.bound(
                        &at,
                        "pattern-removed",
                        format!("{field}: pattern {a} no longer required"),
                        false,
                    ),
                    (Some(a), Some(b)) => self.push(
                        &at,
                        "pattern-changed",
                        format!(
                            "{field}: pattern changed from {a} to {b} (whether either accepts all the other does cannot be decided here: treated as breaking)"
                        ),
                        false,
                        false,
                    ),
                    (None, None) => {}
                },
                "uniqueItems" => {
                    let was = a.and_then(Value::as_bool).unwrap_or(false);
                    let is = b.and_then(Value::as_bool).unwrap_or(false);
                    if was != is {
                        self.bound(
                            &at,
                            if is {
                                "unique-items-required"
                            } else {
                                "unique-items-dropped"
                            },
                            format!(
                                "{field}: array items {} unique",
                                if is { "now must be" } else { "no longer must be" }
                            ),
                            is,
                        );
                    }
                }
                "prefixItems" => self.prefix_items(&at, field, a, b),
                "contains" => match (a, b) {
                    (None, Some(_)) => self.bound(
                        &at,
                        "contains-added",
                        format!("{field}: the array must now contain a matching item"),
                        true,
                    ),
                    (Some(_), None) => self.bound(
                        &at,
                        "contains-removed",
                        format!("{field}: the array no longer must contain a matching item"),
                        false,
                    ),
                    _ => self.unknown(&at, key, field),
                },
                _ => self.unknown(&at, key, field),
            }
        }
    }

    fn unknown(&mut self, at: &str, key: &str, field: &str) {
        self.push(
            at,
            "keyword-unknown",
            format!(
                "{field}: keyword `{key}` changed; this checker does not classify it, so a human must decide (treated as breaking)"
            ),
            false,
            false,
        );
    }

    fn lower_bound(
        &mut self,
        at: &str,
        key: &str,
        field: &str,
        old: Option<&Value>,
        new: Option<&Value>,
    ) {
        let (a, b) = (old.and_then(Num::from_json), new.and_then(Num::from_json));
        let tightened = match (a, b) {
            (None, Some(_)) => true,
            (Some(_), None) => false,
            (Some(a), Some(b)) => b > a,
            (None, None) => return,
        };
        let description = match (a, b) {
            (None, Some(b)) => format!("{field}: `{key}` {b} added"),
            (Some(a), None) => format!("{field}: `{key}` {a} removed"),
            (Some(a), Some(b)) => format!(
                "{field}: `{key}` {} ({a} → {b})",
                if tightened { "raised" } else { "lowered" }
            ),
            (None, None) => return,
        };
        self.bound(
            at,
            if tightened {
                "lower-bound-tightened"
            } else {
                "lower-bound-relaxed"
            },
            description,
            tightened,
        );
    }

    fn upper_bound(
        &mut self,
        at: &str,
        key: &str,
        field: &str,
        old: Option<&Value>,
        new: Option<&Value>,
    ) {
        let (a, b) = (old.and_then(Num::from_json), new.and_then(Num::from_json));
        let tightened = match (a, b) {
            (None, Some(_)) => true,
            (Some(_), None) => false,
            (Some(a), Some(b)) => b < a,
            (None, None) => return,
        };
        let description = match (a, b) {
            (None, Some(b)) => format!("{field}: `{key}` {b} added"),
            (Some(a), None) => format!("{field}: `{key}` {a} removed"),
            (Some(a), Some(b)) => format!(
                "{field}: `{key}` {} ({a} → {b})",
                if tightened { "lowered" } else { "raised" }
            ),
            (None, None) => return,
        };
        self.bound(
            at,
            if tightened {
                "upper-bound-tightened"
            } else {
                "upper-bound-relaxed"
            },
            description,
            tightened,
        );
    }

    fn multiple_of(&mut self, at: &str, field: &str, old: Option<&Value>, new: Option<&Value>) {
        let (a, b) = (
            old.and_then(Value::as_f64).filter(|x| *x > 0.0),
            new.and_then(Value::as_f64).filter(|x| *x > 0.0),
        );
        let divides = |big: f64, small: f64| (big / small - (big / small).round()).abs() < 1e-9;
        match (a, b) {
            (None, Some(b)) => self.bound(
                at,
                "multiple-of-added",
                format!("{field}: must now be a multiple of {b}"),
                true,
            ),
            (Some(a), None) => self.bound(
                at,
                "multiple-of-removed",
                format!("{field}: no longer must be a multiple of {a}"),
                false,
            ),
            (Some(a), Some(b)) if divides(b, a) => self.bound(
                at,
                "multiple-of-tightened",
                format!("{field}: multipleOf {a} → {b}"),
                true,
            ),
            (Some(a), Some(b)) if divides(a, b) => self.bound(
                at,
                "multiple-of-relaxed",
                format!("{field}: multipleOf {a} → {b}"),
                false,
            ),
            (Some(a), Some(b)) => self.push(
                at,
                "multiple-of-changed",
                format!("{field}: multipleOf {a} → {b}"),
                false,
                false,
            ),
            (None, None) => {}
        }
    }

    /// Tuples and fixed-size arrays: each position compared; a position
    /// added or removed changes what a tuple is.
    fn prefix_items(
        &mut self,
        at: &str,
        field: &str,
        old: Option<&'a Value>,
        new: Option<&'a Value>,
    ) {
        let empty: &[Value] = &[];
        let a = old.and_then(Value::as_array).map_or(empty, Vec::as_slice);
        let b = new.and_then(Value::as_array).map_or(empty, Vec::as_slice);
        for index in 0..a.len().min(b.len()) {
            self.compare(&a[index], &b[index], format!("{at}/{index}"));
        }
        if a.len() != b.len() {
            self.push(
                at,
                "tuple-length-changed",
                format!(
                    "{field}: tuple of {} positions became one of {}",
                    a.len(),
                    b.len()
                ),
                false,
                false,
            );
        }
    }
}

/// The alternatives that are plain value sets (`enum` or `const`, no
/// properties): index and values.
fn value_alternatives(root: &Value, alternatives: &[&Value]) -> Vec<(usize, Vec<Value>)> {
    alternatives
        .iter()
        .enumerate()
        .filter_map(|(index, alternative)| {
            let (node, _) = Walker::resolve(root, alternative);
            if node.get("properties").is_some() {
                return None;
            }
            if let Some(Value::Array(values)) = node.get("enum") {
                return Some((index, values.clone()));
            }
            node.get("const").map(|value| (index, vec![value.clone()]))
        })
        .collect()
}

fn contains_ref(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.contains_key("$ref") || map.values().any(contains_ref),
        Value::Array(items) => items.iter().any(contains_ref),
        _ => false,
    }
}

/// A name for an enum alternative: a `const` property (internal tag) or the
/// single required key (external tag).
fn discriminator(alternative: &Value) -> Option<String> {
    let properties = alternative.get("properties")?.as_object()?;
    for (name, schema) in properties {
        if let Some(value) = schema.get("const") {
            return Some(format!("{name}={value}"));
        }
    }
    let required = alternative.get("required")?.as_array()?;
    if required.len() == 1 {
        return required[0].as_str().map(str::to_owned);
    }
    None
}

fn field_name(path: &str) -> String {
    match path.rsplit_once("/properties/") {
        Some((_, name)) if !name.contains('/') => format!("field `{name}`"),
        _ if path.is_empty() => "the payload".to_owned(),
        _ => format!("`{path}`"),
    }
}

fn type_list(types: &BTreeSet<String>) -> String {
    if types.is_empty() {
        return "any".to_owned();
    }
    types.iter().cloned().collect::<Vec<_>>().join("|")
}

/// The range of an integer format, exactly.
fn integer_format_range(format: Option<&str>) -> Option<(i128, i128)> {
    Some(match format? {
        "int8" => (i8::MIN.into(), i8::MAX.into()),
        "int16" => (i16::MIN.into(), i16::MAX.into()),
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "int64" | "int" => (i64::MIN.into(), i64::MAX.into()),
        "uint8" => (0, u8::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint64" | "uint" => (0, u64::MAX.into()),
        _ => return None,
    })
}

/// Negates a bound so that "at least" compares upper bounds too.
fn neg(n: Option<Num>) -> Option<Num> {
    n.map(|n| match n {
        Num::Int(i) => Num::Int(-i),
        Num::Float(f) => Num::Float(-f),
    })
}

/// A numeric range in words: `0..=255`, `>= 1`, `<= 10`, `unbounded`.
fn bounds_text(low: Option<Num>, high: Option<Num>) -> String {
    match (low, high) {
        (Some(low), Some(high)) => format!("{low}..={high}"),
        (Some(low), None) => format!(">= {low}"),
        (None, Some(high)) => format!("<= {high}"),
        (None, None) => "unbounded".to_owned(),
    }
}

/// The format's name with its exact range (`int64 (-9223372036854775808..=9223372036854775807)`),
/// or the bounds alone.
fn format_or_bounds(format: Option<&str>, low: Option<Num>, high: Option<Num>) -> String {
    match format {
        Some(format) if low.is_none() && high.is_none() => format.to_owned(),
        Some(format) => format!("{format} ({})", bounds_text(low, high)),
        None => bounds_text(low, high),
    }
}

/// The numeric range a shape admits, from its integer format and bounds.
fn numeric_range(shape: &Shape<'_>) -> Option<(Option<Num>, Option<Num>)> {
    let from_format = integer_format_range(shape.format);
    if from_format.is_none() && shape.minimum.is_none() && shape.maximum.is_none() {
        return None;
    }
    let (mut low, mut high) = match from_format {
        Some((low, high)) => (Some(Num::Int(low)), Some(Num::Int(high))),
        None => (None, None),
    };
    if let Some(minimum) = shape.minimum {
        low = Some(match low {
            Some(low) if low > minimum => low,
            _ => minimum,
        });
    }
    if let Some(maximum) = shape.maximum {
        high = Some(match high {
            Some(high) if high < maximum => high,
            _ => maximum,
        });
    }
    Some((low, high))
}
