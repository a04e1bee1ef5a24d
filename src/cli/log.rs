//! A training run's log: one CSV row per logging step (`log.csv`, rewritten atomically) and
//! the curves of every column against the step (`curves.png`).
//!
//! ```
//! use torchrl::cli::log::RunLog;
//! # fn main() -> torchrl::Result<()> {
//! let dir = std::env::temp_dir().join(format!("torchrl-runlog-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let mut log = RunLog::new(&dir, &["step", "loss"], "SFT")?;
//! log.push(&[10.0, 2.5])?;
//! log.push(&[20.0, 1.5])?;
//! let text = std::fs::read_to_string(dir.join("log.csv")).unwrap();
//! assert_eq!(text, "step,loss\n10,2.5\n20,1.5\n");
//! // a resumed run keeps the rows up to its checkpoint's step
//! let log = RunLog::resume(&dir, &["step", "loss"], "SFT", 10.0)?;
//! assert_eq!(log.rows(), &[vec![10.0, 2.5]]);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The CSV log and PNG curves of a run (see the [module docs](self)). The first column is
/// the step.
#[derive(Debug, Clone)]
pub struct RunLog {
    csv: PathBuf,
    png: PathBuf,
    columns: Vec<String>,
    rows: Vec<Vec<f64>>,
    title: String,
}

impl RunLog {
    /// A new, empty log in `dir` (`log.csv`, `curves.png`) with `columns` (the first is the
    /// step).
    ///
    /// # Errors
    /// [`Error::InvalidValue`] for no columns.
    pub fn new(dir: &Path, columns: &[&str], title: &str) -> Result<Self> {
        if columns.is_empty() {
            return Err(Error::argument(
                "RunLog::new",
                "columns",
                "at least the step column",
                "none",
            ));
        }
        Ok(RunLog {
            csv: dir.join("log.csv"),
            png: dir.join("curves.png"),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
            title: title.to_string(),
        })
    }

    /// The log a resumed run continues: the rows of `dir/log.csv` whose step is at most
    /// `up_to_step` (an absent file: none).
    ///
    /// # Errors
    /// A file with other columns, or a row that does not parse (naming the line).
    pub fn resume(dir: &Path, columns: &[&str], title: &str, up_to_step: f64) -> Result<Self> {
        let mut log = Self::new(dir, columns, title)?;
        let Ok(text) = fs::read_to_string(&log.csv) else {
            return Ok(log);
        };
        let bad = |line: usize, why: String| Error::InvalidFile {
            op: "RunLog::resume",
            path: log.csv.display().to_string(),
            reason: format!("line {line}: {why}"),
        };
        let mut lines = text.lines();
        let header = lines.next().unwrap_or_default();
        if header != log.columns.join(",") {
            return Err(bad(
                1,
                format!("columns {header:?}, expected {:?}", log.columns.join(",")),
            ));
        }
        for (i, line) in lines.enumerate() {
            let row: Vec<f64> = line
                .split(',')
                .map(|v| v.parse::<f64>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| bad(i + 2, format!("{line:?}: {e}")))?;
            if row.len() != log.columns.len() {
                return Err(bad(
                    i + 2,
                    format!("{} values, expected {}", row.len(), log.columns.len()),
                ));
            }
            if row.first().is_some_and(|s| *s <= up_to_step) {
                log.rows.push(row);
            }
        }
        Ok(log)
    }

    /// The rows so far.
    pub fn rows(&self) -> &[Vec<f64>] {
        &self.rows
    }

    /// Appends a row (one value per column), rewrites the CSV atomically and redraws the
    /// curves (a plotting failure is reported on standard error, not returned: the log is
    /// what matters).
    ///
    /// # Errors
    /// A row of the wrong length, or the CSV cannot be written.
    pub fn push(&mut self, row: &[f64]) -> Result<()> {
        if row.len() != self.columns.len() {
            return Err(Error::argument(
                "RunLog::push",
                "row",
                format!("{} values ({:?})", self.columns.len(), self.columns),
                format!("{} values", row.len()),
            ));
        }
        self.rows.push(row.to_vec());
        self.write_csv()?;
        if let Err(e) = self.plot() {
            eprintln!("torchrl: could not draw {}: {e}", self.png.display());
        }
        Ok(())
    }

    fn write_csv(&self) -> Result<()> {
        let io = |e: std::io::Error| Error::Io {
            op: "RunLog::push",
            path: self.csv.display().to_string(),
            source: e,
        };
        let tmp = self.csv.with_extension("csv.tmp");
        let mut f = fs::File::create(&tmp).map_err(io)?;
        writeln!(f, "{}", self.columns.join(",")).map_err(io)?;
        for row in &self.rows {
            // shortest exact decimals: a resumed run reads the rows back bit for bit
            let cells: Vec<String> = row.iter().map(|v| v.to_string()).collect();
            writeln!(f, "{}", cells.join(",")).map_err(io)?;
        }
        f.sync_all().map_err(io)?;
        drop(f);
        fs::rename(&tmp, &self.csv).map_err(io)
    }

    /// One panel per column after the step (at most six), each its curve against the step.
    fn plot(&self) -> std::result::Result<(), Box<dyn std::error::Error>> {
        use plotters::prelude::*;
        let text = register_font();
        let series: Vec<usize> = (1..self.columns.len()).take(6).collect();
        if series.is_empty() || self.rows.is_empty() {
            return Ok(());
        }
        let cols = series.len().min(3);
        let lines = series.len().div_ceil(cols);
        let root = BitMapBackend::new(&self.png, (420 * cols as u32, 320 * lines as u32))
            .into_drawing_area();
        root.fill(&WHITE)?;
        let areas = root.split_evenly((lines, cols));
        let step = |r: Option<&Vec<f64>>, default: f64| {
            r.and_then(|r| r.first()).copied().unwrap_or(default)
        };
        let x0 = step(self.rows.first(), 0.0);
        let x1 = step(self.rows.last(), 1.0).max(x0 + 1.0);
        let name = |c: usize| self.columns.get(c).map_or("", String::as_str);
        for (area, &c) in areas.iter().zip(&series) {
            let points: Vec<(f64, f64)> = self
                .rows
                .iter()
                .filter_map(|r| Some((*r.first()?, *r.get(c)?)))
                .filter(|p| p.1.is_finite())
                .collect();
            let (lo, hi) = points
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
                    (a.min(p.1), b.max(p.1))
                });
            let (lo, hi) = if lo.is_finite() && hi.is_finite() {
                let pad = ((hi - lo) * 0.1).max(1e-6);
                (lo - pad, hi + pad)
            } else {
                (0.0, 1.0)
            };
            let mut builder = ChartBuilder::on(area);
            builder
                .margin(10)
                .x_label_area_size(if text { 28 } else { 5 })
                .y_label_area_size(if text { 50 } else { 5 });
            if text {
                builder.caption(format!("{}: {}", self.title, name(c)), ("sans-serif", 16));
            }
            let mut chart = builder.build_cartesian_2d(x0..x1, lo..hi)?;
            let mut mesh = chart.configure_mesh();
            if text {
                mesh.x_desc(name(0));
            } else {
                mesh.x_labels(0).y_labels(0);
            }
            mesh.draw()?;
            chart.draw_series(LineSeries::new(points, BLUE.stroke_width(2)))?;
        }
        root.present()?;
        Ok(())
    }
}

/// Registers a system TrueType font for the plots' text (plotters' `ab_glyph` backend needs
/// one); `false` when none is found (the plots are then drawn without text).
pub fn register_font() -> bool {
    use std::sync::OnceLock;
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        const FONTS: [&str; 4] = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/Library/Fonts/Arial.ttf",
        ];
        for path in FONTS {
            if let Ok(bytes) = fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(
                    "sans-serif",
                    plotters::style::FontStyle::Normal,
                    bytes,
                )
                .is_ok()
                {
                    return true;
                }
            }
        }
        false
    })
}
