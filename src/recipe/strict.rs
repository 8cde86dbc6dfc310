//! Strict numbers for recipe fields.
//!
//! serde-saphyr turns a quoted `"3"` into the number 3 when a number is
//! expected. A recipe means what it says, so numeric fields are read through
//! these functions instead: they take the value as YAML typed it
//! (`deserialize_any`) and reject quoted strings, booleans, nulls, negative
//! or fractional counts with plain messages (the field and line are added by
//! [`super::errors`]).

use serde::Deserializer;
use serde::de::{self, Visitor};

/// A number as YAML typed it.
enum Num {
    Int(i128),
    Float(f64),
}

struct NumVisitor;

impl<'de> Visitor<'de> for NumVisitor {
    type Value = Num;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a number")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
        Ok(Num::Int(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
        Ok(Num::Int(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Num, E> {
        Ok(Num::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Num, E> {
        Ok(Num::Int(i128::try_from(v).unwrap_or(i128::MAX)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Num, E> {
        Ok(Num::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Num, E> {
        let t = v.trim();
        if !t.is_empty() && t.parse::<f64>().is_ok() {
            Err(E::custom(format!(
                "{v:?} is a quoted string, not a number; write the number without quotes: {t}"
            )))
        } else {
            Err(E::custom(format!(
                "expected a number, found the text {v:?}"
            )))
        }
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Num, E> {
        Err(E::custom(format!("expected a number, found `{v}`")))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Num, E> {
        Err(E::custom(
            "has no value; write a number, or remove the line to use the default",
        ))
    }
    fn visit_none<E: de::Error>(self) -> Result<Num, E> {
        self.visit_unit()
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Num, A::Error> {
        Err(de::Error::custom("expected a number, found a list"))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<Num, A::Error> {
        Err(de::Error::custom("expected a number, found a mapping"))
    }
}

/// A whole number in `0..=max`.
fn whole<'de, D: Deserializer<'de>>(d: D, max: u64) -> Result<u64, D::Error> {
    let n = match d.deserialize_any(NumVisitor)? {
        Num::Int(n) => n,
        Num::Float(f) if f.fract() == 0.0 && f.abs() < 1e30 => {
            return Err(de::Error::custom(format!(
                "{f} is written as a decimal or exponent number; write the whole number as digits (e.g. 3)"
            )));
        }
        Num::Float(f) => {
            return Err(de::Error::custom(format!("{f} is not a whole number")));
        }
    };
    if n < 0 {
        return Err(de::Error::custom(format!(
            "{n} is negative; expected a whole number"
        )));
    }
    u64::try_from(n)
        .ok()
        .filter(|&n| n <= max)
        .ok_or_else(|| de::Error::custom(format!("{n} is too large (at most {max})")))
}

/// A `u32` field: a whole number written without quotes.
pub fn u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    // The range check in `whole` makes the conversion exact.
    whole(d, u32::MAX.into()).map(|n| n as u32)
}

/// A `u64` field: a whole number written without quotes.
pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    whole(d, u64::MAX)
}

/// An `f64` field: a number written without quotes.
pub fn f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(match d.deserialize_any(NumVisitor)? {
        Num::Int(n) => n as f64,
        Num::Float(f) => f,
    })
}

/// An optional `f64` field (`~` or no value: absent).
pub fn opt_f64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    struct Opt;
    impl<'de> Visitor<'de> for Opt {
        type Value = Option<f64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            f64(d).map(Some)
        }
    }
    d.deserialize_option(Opt)
}

/// One element of a list of `u32`.
struct U32(u32);

impl<'de> serde::Deserialize<'de> for U32 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u32(d).map(U32)
    }
}

/// An optional list of `u32` (token ids).
pub fn opt_vec_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u32>>, D::Error> {
    let v: Option<Vec<U32>> = serde::Deserialize::deserialize(d)?;
    Ok(v.map(|v| v.into_iter().map(|U32(n)| n).collect()))
}
