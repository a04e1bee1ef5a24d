//! [`CosineAnnealingLr`]: the learning-rate schedule of the RLHF trainers (trlX's
//! `cosine_annealing`), re-exported from [`optim`](super::optim) beside the optimizer it drives.

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::trainers::config::{check_cosine, CosineKwargs, MAX_STEPS};

/// PyTorch's `CosineAnnealingLR` in closed form, as trlX builds it
/// (`T_max`, `eta_min` from `scheduler.kwargs`; `base_lr` is the optimizer's initial rate):
/// after `e` steps, `lr = eta_min + (base_lr - eta_min) · (1 + cos(π·e / T_max)) / 2`
/// (continuing past `T_max` as a cosine, as PyTorch does).
#[derive(Debug, Clone, PartialEq)]
pub struct CosineAnnealingLr {
    /// The rate at step 0.
    pub base_lr: f64,
    /// The half period, in steps.
    pub t_max: f64,
    /// The rate at step `t_max`.
    pub eta_min: f64,
    /// Steps taken (PyTorch's `last_epoch`).
    pub last_epoch: u64,
}

impl CosineAnnealingLr {
    /// A schedule at step 0.
    ///
    /// # Errors
    /// When `base_lr` is not in (0, [`MAX_LR`](crate::trainers::config::MAX_LR)], `t_max` is not a finite number large enough
    /// for a finite phase (see `check_cosine`), or `eta_min` is not in [0, `MAX_LR`].
    pub fn new(base_lr: f64, t_max: f64, eta_min: f64) -> Result<Self> {
        const OP: &str = "CosineAnnealingLr::new";
        check_cosine(OP, ["base_lr", "T_max", "eta_min"], base_lr, t_max, eta_min)?;
        Ok(CosineAnnealingLr {
            base_lr,
            t_max,
            eta_min,
            last_epoch: 0,
        })
    }

    /// The schedule of trlX's `scheduler.kwargs` for an optimizer starting at `base_lr`.
    ///
    /// ```
    /// use torchrl::trainers::{config::CosineKwargs, optim::CosineAnnealingLr};
    /// let s = CosineAnnealingLr::from_kwargs(3e-5, &CosineKwargs::default()).unwrap();
    /// assert_eq!((s.t_max, s.eta_min), (1e12, 3e-5));
    /// ```
    ///
    /// # Errors
    /// As [`CosineAnnealingLr::new`].
    pub fn from_kwargs(base_lr: f64, kwargs: &CosineKwargs) -> Result<Self> {
        CosineAnnealingLr::new(base_lr, kwargs.t_max, kwargs.eta_min)
    }

    /// The rate after `epoch` steps.
    ///
    /// ```
    /// use torchrl::trainers::optim::CosineAnnealingLr;
    /// let s = CosineAnnealingLr::new(1.0, 4.0, 0.0).unwrap();
    /// assert_eq!(s.lr_at(0), 1.0);
    /// assert!((s.lr_at(2) - 0.5).abs() < 1e-15);
    /// assert_eq!(s.lr_at(4), 0.0);
    /// assert!((s.lr_at(6) - 0.5).abs() < 1e-15); // past T_max it rises again
    /// ```
    pub fn lr_at(&self, epoch: u64) -> f64 {
        // Counts past MAX_STEPS = 2^53 (never reached) are held there: the conversion is
        // exact and the phase finite (see `check_cosine`).
        let e = epoch.min(MAX_STEPS) as f64;
        self.eta_min
            + (self.base_lr - self.eta_min) * (1.0 + (std::f64::consts::PI * e / self.t_max).cos())
                / 2.0
    }

    /// The current rate (PyTorch's `get_last_lr()`).
    pub fn lr(&self) -> f64 {
        self.lr_at(self.last_epoch)
    }

    /// Advances one step and returns the new rate (give it to [`AdamW::set_lr`]).
    pub fn step(&mut self) -> f64 {
        self.last_epoch = self.last_epoch.saturating_add(1);
        self.lr()
    }

    /// The schedule as JSON (`base_lr`, `T_max`, `eta_min`, `last_epoch`), for checkpoints.
    pub fn state_json(&self) -> Value {
        json!({
            "base_lr": self.base_lr,
            "T_max": self.t_max,
            "eta_min": self.eta_min,
            "last_epoch": self.last_epoch,
        })
    }

    /// Restores a schedule from [`CosineAnnealingLr::state_json`].
    ///
    /// ```
    /// use torchrl::trainers::optim::CosineAnnealingLr;
    /// let mut s = CosineAnnealingLr::new(1.0, 4.0, 0.1).unwrap();
    /// s.step();
    /// let back = CosineAnnealingLr::from_state_json(&s.state_json()).unwrap();
    /// assert_eq!(back, s);
    /// ```
    ///
    /// # Errors
    /// When a field is missing or out of range.
    pub fn from_state_json(state: &Value) -> Result<Self> {
        const OP: &str = "CosineAnnealingLr::from_state_json";
        let num = |field: &str| -> Result<f64> {
            state
                .get(field)
                .and_then(Value::as_f64)
                .ok_or_else(|| Error::value(OP, field, "a number in the state JSON", "none"))
        };
        let mut s = CosineAnnealingLr::new(num("base_lr")?, num("T_max")?, num("eta_min")?)?;
        s.last_epoch = state
            .get("last_epoch")
            .and_then(Value::as_u64)
            .ok_or_else(|| Error::value(OP, "last_epoch", "a step count", "none"))?;
        if s.last_epoch > MAX_STEPS {
            return Err(Error::value(
                OP,
                "last_epoch",
                format!("a step count of at most {MAX_STEPS}"),
                s.last_epoch.to_string(),
            ));
        }
        Ok(s)
    }
}
