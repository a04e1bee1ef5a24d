//! `Display` and `Debug` for [`TensorDict`]: a readable tree of keys, shapes, dtypes, devices.

use std::fmt;

use super::{Entry, TensorDict};
use crate::error::ShapeFmt;

fn fmt_level(td: &TensorDict, f: &mut fmt::Formatter<'_>, indent: usize) -> fmt::Result {
    let pad = "    ".repeat(indent);
    for (k, e) in &td.entries {
        match e {
            Entry::Tensor(t) => writeln!(
                f,
                "{pad}{k}: Tensor(shape={}, dtype={:?}, device={:?})",
                ShapeFmt(&t.size()),
                t.kind(),
                t.device()
            )?,
            Entry::Dict(d) => {
                writeln!(
                    f,
                    "{pad}{k}: TensorDict(batch_size={})",
                    ShapeFmt(&d.batch_size)
                )?;
                fmt_level(d, f, indent + 1)?;
            }
        }
    }
    Ok(())
}

impl fmt::Display for TensorDict {
    /// ```
    /// use tch::{Device, Kind, Tensor};
    /// use torchrl::TensorDict;
    /// let td = TensorDict::new([2]).unwrap()
    ///     .with(("next", "reward"), Tensor::zeros([2, 1], (Kind::Float, Device::Cpu))).unwrap();
    /// let s = td.to_string();
    /// assert!(s.contains("next: TensorDict(batch_size=[2])"));
    /// assert!(s.contains("    reward: Tensor(shape=[2, 1], dtype=Float, device=Cpu)"));
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let device = match self.device {
            Some(d) => format!("{d:?}"),
            None => "None".to_string(),
        };
        writeln!(
            f,
            "TensorDict(batch_size={}, device={device})",
            ShapeFmt(&self.batch_size)
        )?;
        fmt_level(self, f, 1)
    }
}

impl fmt::Debug for TensorDict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
