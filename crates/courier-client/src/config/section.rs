//! The strict reader behind every options object the application hands over: `Protocol`'s
//! config here, and the relay's and gateway's options in the Node binding.
//!
//! Unknown keys are an error at every depth, with a "did you mean" hint for a key that differs
//! only in case (a typo must not silently fall back to a default). A JSON `null` is the same as
//! leaving the key out, because the JS side may turn an `undefined` property into `null`.
//! Integers are JSON numbers that are whole and at most 2^53 (the largest integer a JavaScript
//! number holds exactly); `5000` and `5000.0` are the same value.

use serde_json::{Map, Value};

use super::ConfigError;

/// Largest integer a JavaScript number represents exactly.
pub const MAX_SAFE_INTEGER: u64 = 1 << 53;

/// One JSON object at `path`, whose keys were checked against the known ones. Each reader
/// returns `Ok(None)` for an absent key and a [`ConfigError`] naming `path.key` for a wrong one.
pub struct Section<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Section<'a> {
    /// The top-level object; `name` is what its errors call it when it is not an object
    /// (`config`, `options`).
    pub fn root(value: &'a Value, name: &str, known: &[&str]) -> Result<Self, ConfigError> {
        let Value::Object(map) = value else {
            return Err(ConfigError::new(name, "must be an object"));
        };
        let s = Self {
            path: String::new(),
            map,
        };
        s.check_keys(known)?;
        Ok(s)
    }

    fn child_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// An error about `key` of this section: `"{path}.{key} {message}"`.
    pub fn error(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.child_path(key), message)
    }

    fn check_keys(&self, known: &[&str]) -> Result<(), ConfigError> {
        for key in self.map.keys() {
            if known.contains(&key.as_str()) {
                continue;
            }
            let hint = known
                .iter()
                .find(|k| k.eq_ignore_ascii_case(key))
                .map(|k| format!(" (did you mean {k}?)"))
                .unwrap_or_default();
            return Err(self.error(key, format!("is not a known option{hint}")));
        }
        Ok(())
    }

    /// The value of `key`; `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// The object at `key`, its keys checked against `known`.
    pub fn section(&self, key: &str, known: &[&str]) -> Result<Option<Section<'a>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => {
                let s = Section {
                    path: self.child_path(key),
                    map,
                };
                s.check_keys(known)?;
                Ok(Some(s))
            }
            Some(_) => Err(self.error(key, "must be an object")),
        }
    }

    pub fn string(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.error(key, "must be a string")),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.error(key, "must be a boolean")),
        }
    }

    pub fn number(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.error(key, "must be a number")),
            Some(_) => Err(self.error(key, "must be a number")),
        }
    }

    /// A whole number in `1..=max` (`max` capped at 2^53).
    pub fn positive_int(&self, key: &str, max: u64) -> Result<Option<u64>, ConfigError> {
        const KIND: &str = "must be a positive integer";
        match self.whole(key, max, KIND)? {
            Some(0) => Err(self.error(key, KIND)),
            v => Ok(v),
        }
    }

    /// A whole number in `0..=max` (`max` capped at 2^53).
    pub fn non_negative_int(&self, key: &str, max: u64) -> Result<Option<u64>, ConfigError> {
        self.whole(key, max, "must be a non-negative integer")
    }

    /// A whole number in `0..=max`; `kind` is the error for anything that is not one.
    fn whole(&self, key: &str, max: u64, kind: &str) -> Result<Option<u64>, ConfigError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let max = max.min(MAX_SAFE_INTEGER);
        let Value::Number(n) = value else {
            return Err(self.error(key, kind));
        };
        let v = if let Some(u) = n.as_u64() {
            u
        } else if n.as_i64().is_some() {
            return Err(self.error(key, kind)); // negative
        } else {
            match n.as_f64() {
                Some(f) if f.is_finite() && f.fract() == 0.0 && f >= 0.0 => {
                    if f > max as f64 {
                        return Err(self.error(key, format!("must be at most {max}")));
                    }
                    f as u64
                }
                _ => return Err(self.error(key, kind)),
            }
        };
        if v > max {
            return Err(self.error(key, format!("must be at most {max}")));
        }
        Ok(Some(v))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_root_is_named_by_its_caller() {
        let e = Section::root(&json!([]), "options", &[]).err().unwrap();
        assert_eq!(e.to_string(), "options must be an object");
    }

    #[test]
    fn positive_refuses_zero_and_non_negative_takes_it() {
        let value = json!({ "n": 0, "m": 1.0, "big": 4_294_967_296u64 });
        let root = Section::root(&value, "options", &["n", "m", "big"]).unwrap();
        assert_eq!(
            root.positive_int("n", 10).unwrap_err().to_string(),
            "n must be a positive integer"
        );
        assert_eq!(root.non_negative_int("n", 10), Ok(Some(0)));
        assert_eq!(root.positive_int("m", 10), Ok(Some(1)));
        assert_eq!(root.positive_int("absent", 10), Ok(None));
        assert_eq!(
            root.positive_int("big", u64::from(u32::MAX))
                .unwrap_err()
                .to_string(),
            "big must be at most 4294967295"
        );
    }
}
