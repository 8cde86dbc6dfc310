//! The pipeline stages, one module each, in the order data flows:
//! recipe -> [`source`] -> [`wheel`] -> [`venv`] (install, [`identity`], [`smoke`]) -> record.

pub mod ext;
pub mod hermetic;
pub mod identity;
pub mod lock;
pub mod smoke;
pub mod source;
pub mod venv;
pub mod wheel;
