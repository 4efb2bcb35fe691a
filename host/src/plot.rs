//! Plots of benchmark results: TFLOP/s against sequence length, as `fa3 bench --plot` and
//! `fa3 plot` draw them.
//!
//! The figure has one panel per (mask, head dim): a row for non-causal and a row for
//! causal, a column per head dim. Each implementation is one series, ours (from
//! `fa3 bench --csv`) drawn solid, peers (from `scripts/peers.py`, or the anchors' CSVs)
//! dashed. The x axis is log2 of the sequence length (512, 1k, ... 16k on the paper's
//! grid); every panel has the same axes, so heights compare across panels.
//!
//! SVG needs no system library; PNG is drawn with an embedded font
//! (DejaVu Sans, `host/assets/`), so neither depends on the fonts of the machine.
//!
//! ```
//! use flash_attn3::plot::{parse_csv, render_svg};
//! let ours = parse_csv("impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops\n\
//!                       rust-fa3,f16,128,512,32,16,0,0.1,300.0\n\
//!                       rust-fa3,f16,128,1024,16,16,0,0.1,400.0\n")?;
//! let svg = render_svg(&ours, &[], "example")?;
//! assert!(svg.contains("rust-fa3"));
//! # Ok::<(), flash_attn3::plot::PlotError>(())
//! ```
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// One measured configuration: an implementation's TFLOP/s at one shape of the grid.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The implementation, the name of its series (`impl` or `backend` column).
    pub series: String,
    /// Head dimension.
    pub hdim: usize,
    /// Sequence length (queries and keys).
    pub seqlen: usize,
    /// Causal mask.
    pub causal: bool,
    /// Throughput, TFLOP/s.
    pub tflops: f64,
}

/// Why a plot could not be made.
#[derive(Debug)]
pub enum PlotError {
    /// A CSV file that cannot be read or parsed (the message names the file or line).
    Csv(String),
    /// An output name that is neither `.svg` nor `.png`.
    Format(String),
    /// No data point to draw.
    NoData,
    /// The drawing backend failed (for instance, the output file cannot be written).
    Draw(String),
}

impl std::fmt::Display for PlotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlotError::Csv(m) | PlotError::Draw(m) => f.write_str(m),
            PlotError::Format(p) => write!(f, "{p}: the plot must be a .svg or .png file"),
            PlotError::NoData => f.write_str("no results to plot"),
        }
    }
}

impl std::error::Error for PlotError {}

/// The image formats [`draw`] writes, chosen by the file's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics (`.svg`).
    Svg,
    /// Portable network graphics (`.png`).
    Png,
}

impl Format {
    /// The format of `path` from its extension (case-insensitive), or an error naming it.
    pub fn from_path(path: &Path) -> Result<Format, PlotError> {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(PlotError::Format(path.display().to_string())),
        }
    }
}

/// Parses a CSV of results with a header line. Columns are found by name, so both
/// `fa3 bench --csv` / `scripts/peers.py` files (`impl,dtype,hdim,seqlen,batch,heads,
/// causal,ms,tflops`) and the anchors' (`backend,hdim,seqlen,batch,heads,causal,pass,
/// ms,tflops`) work: the series is `impl` or else `backend`; `hdim`, `seqlen`, `causal`
/// (0/1) and `tflops` are required; where a `pass` column exists only `fwd` rows are kept.
/// Empty lines and lines starting with `#` are skipped.
pub fn parse_csv(text: &str) -> Result<Vec<Point>, PlotError> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'));
    let Some((_, header)) = lines.next() else { return Ok(Vec::new()) };
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| *c == name);
    let need = |name: &str| col(name).ok_or_else(|| PlotError::Csv(format!("no {name:?} column in the header {header:?}")));
    let series = col("impl").or_else(|| col("backend")).ok_or_else(|| {
        PlotError::Csv(format!("no \"impl\" or \"backend\" column in the header {header:?}"))
    })?;
    let (hdim, seqlen, causal, tflops) = (need("hdim")?, need("seqlen")?, need("causal")?, need("tflops")?);
    let pass = col("pass");
    let mut points = Vec::new();
    for (i, line) in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != cols.len() {
            return Err(PlotError::Csv(format!("line {}: {} fields, the header has {}", i + 1, f.len(), cols.len())));
        }
        if pass.is_some_and(|p| f[p] != "fwd") {
            continue;
        }
        let bad = |name: &str, v: &str| PlotError::Csv(format!("line {}: cannot parse {name} {v:?}", i + 1));
        points.push(Point {
            series: f[series].to_string(),
            hdim: f[hdim].parse().map_err(|_| bad("hdim", f[hdim]))?,
            seqlen: f[seqlen].parse().map_err(|_| bad("seqlen", f[seqlen]))?,
            causal: match f[causal] {
                "0" | "false" | "False" => false,
                "1" | "true" | "True" => true,
                v => return Err(bad("causal", v)),
            },
            tflops: f[tflops].parse().map_err(|_| bad("tflops", f[tflops]))?,
        });
    }
    Ok(points)
}

/// Reads and parses a CSV file (see [`parse_csv`]); errors name the file.
pub fn read_csv(path: &Path) -> Result<Vec<Point>, PlotError> {
    let text = std::fs::read_to_string(path).map_err(|e| PlotError::Csv(format!("{}: {e}", path.display())))?;
    parse_csv(&text).map_err(|e| PlotError::Csv(format!("{}: {e}", path.display())))
}

/// Draws the figure of `ours` (solid) and `peers` (dashed) under `title` into `path`,
/// as SVG or PNG by its extension.
pub fn draw(ours: &[Point], peers: &[Point], title: &str, path: &Path) -> Result<(), PlotError> {
    let format = Format::from_path(path)?;
    let fig = Figure::new(ours, peers)?;
    match format {
        Format::Svg => {
            let svg = render(&fig, title)?;
            std::fs::write(path, svg).map_err(|e| PlotError::Draw(format!("{}: {e}", path.display())))
        }
        Format::Png => {
            register_font()?;
            let root = BitMapBackend::new(path, fig.size()).into_drawing_area();
            fig.draw_on(&root, title)?;
            root.present().map_err(|e| PlotError::Draw(format!("{}: {e}", path.display())))
        }
    }
}

/// The figure of [`draw`] as an SVG document.
pub fn render_svg(ours: &[Point], peers: &[Point], title: &str) -> Result<String, PlotError> {
    render(&Figure::new(ours, peers)?, title)
}

fn render(fig: &Figure, title: &str) -> Result<String, PlotError> {
    // Text is laid out with the embedded font's metrics, even where the SVG names a family.
    register_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, fig.size()).into_drawing_area();
        fig.draw_on(&root, title)?;
        root.present().map_err(|e| PlotError::Draw(e.to_string()))?;
    }
    Ok(svg)
}

/// DejaVu Sans (Bitstream Vera license, host/assets/LICENSE-DejaVu).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

fn register_font() -> Result<(), PlotError> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok { Ok(()) } else { Err(PlotError::Draw("the embedded font cannot be read".into())) }
}

/// Series colours (matplotlib's tab10): ours first, then peers, in order of name.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

const PANEL_W: u32 = 440;
const PANEL_H: u32 = 340;
const TITLE_H: u32 = 40;

struct Series {
    name: String,
    peer: bool,
    color: RGBColor,
    /// (hdim, causal) -> points (log2 seqlen, TFLOP/s), by seqlen.
    panels: BTreeMap<(usize, bool), Vec<(f64, f64)>>,
}

/// The data of a figure, grouped and scaled.
struct Figure {
    series: Vec<Series>,
    hdims: Vec<usize>,
    masks: Vec<bool>,
    x_range: (f64, f64),
    x_keys: Vec<f64>,
    y_max: f64,
}

impl Figure {
    fn new(ours: &[Point], peers: &[Point]) -> Result<Figure, PlotError> {
        let all = || ours.iter().chain(peers);
        if all().next().is_none() {
            return Err(PlotError::NoData);
        }
        let mut series = Vec::new();
        for (points, peer) in [(ours, false), (peers, true)] {
            // Repeated measurements of one config (several rounds in one file): the median.
            let mut groups: BTreeMap<&str, BTreeMap<(usize, bool, usize), Vec<f64>>> = BTreeMap::new();
            for p in points {
                groups.entry(&p.series).or_default().entry((p.hdim, p.causal, p.seqlen)).or_default().push(p.tflops);
            }
            for (name, configs) in groups {
                let mut panels: BTreeMap<(usize, bool), Vec<(f64, f64)>> = BTreeMap::new();
                for ((hdim, causal, seqlen), mut v) in configs {
                    v.sort_by(f64::total_cmp);
                    let median = if v.len() % 2 == 1 { v[v.len() / 2] } else { (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0 };
                    panels.entry((hdim, causal)).or_default().push(((seqlen as f64).log2(), median));
                }
                let color = PALETTE[series.len() % PALETTE.len()];
                series.push(Series { name: name.to_string(), peer, color, panels });
            }
        }
        let mut hdims: Vec<usize> = all().map(|p| p.hdim).collect();
        hdims.sort_unstable();
        hdims.dedup();
        let mut masks: Vec<bool> = all().map(|p| p.causal).collect();
        masks.sort_unstable();
        masks.dedup();
        let log2 = |p: &Point| (p.seqlen.max(1) as f64).log2();
        let lo = all().map(log2).fold(f64::INFINITY, f64::min).floor();
        let hi = all().map(log2).fold(f64::NEG_INFINITY, f64::max).ceil();
        let x_keys = (lo as i64..=hi as i64).map(|k| k as f64).collect();
        // Of the points drawn (medians), not of every round.
        let y_max = series.iter().flat_map(|s| s.panels.values().flatten()).map(|&(_, y)| y).fold(0.0, f64::max);
        let y_max = if y_max > 0.0 && y_max.is_finite() { y_max * 1.1 } else { 1.0 };
        Ok(Figure { series, hdims, masks, x_range: (lo - 0.3, hi + 0.3), x_keys, y_max })
    }

    fn size(&self) -> (u32, u32) {
        (PANEL_W * self.hdims.len() as u32, PANEL_H * self.masks.len() as u32 + TITLE_H)
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, title: &str) -> Result<(), PlotError> {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| PlotError::Draw(e.to_string());
        root.fill(&WHITE).map_err(err)?;
        let body = root.titled(title, (FAMILY, 22)).map_err(err)?;
        let panels = body.split_evenly((self.masks.len(), self.hdims.len()));
        for (i, area) in panels.iter().enumerate() {
            let causal = self.masks[i / self.hdims.len()];
            let hdim = self.hdims[i % self.hdims.len()];
            self.draw_panel(area, hdim, causal)?;
        }
        Ok(())
    }

    fn draw_panel<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>, hdim: usize, causal: bool) -> Result<(), PlotError> {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| PlotError::Draw(e.to_string());
        let caption = format!("hdim {hdim}, {}", if causal { "causal" } else { "non-causal" });
        let (x0, x1) = self.x_range;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, (FAMILY, 17))
            .margin(8)
            .x_label_area_size(36)
            .y_label_area_size(46)
            .build_cartesian_2d(Log2Axis { lo: x0, hi: x1, keys: self.x_keys.clone() }, 0.0..self.y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("sequence length")
            .y_desc("TFLOP/s")
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 14))
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .draw()
            .map_err(err)?;
        let mut labelled = false;
        for s in &self.series {
            let Some(points) = s.panels.get(&(hdim, causal)) else { continue };
            let style = s.color.stroke_width(2);
            let color = s.color;
            if s.peer {
                chart
                    .draw_series(DashedLineSeries::new(points.iter().copied(), 7, 5, style))
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| DashedPathElement::new(vec![(x, y), (x + 20, y)], 5, 3, style));
                chart
                    .draw_series(points.iter().map(|&p| TriangleMarker::new(p, 4, color.filled())))
                    .map_err(err)?;
            } else {
                chart
                    .draw_series(LineSeries::new(points.iter().copied(), style).point_size(3))
                    .map_err(err)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            }
            labelled = true;
        }
        if labelled {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .label_font((FAMILY, 13))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .draw()
                .map_err(err)?;
        }
        Ok(())
    }
}

/// The x axis: log2 of the sequence length, a tick at each power of two, labelled with
/// the length (`512`, `1k`, ... `16k`).
struct Log2Axis {
    lo: f64,
    hi: f64,
    keys: Vec<f64>,
}

impl Ranged for Log2Axis {
    type ValueType = f64;
    type FormatOption = plotters::coord::ranged1d::NoDefaultFormatting;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let t = (value - self.lo) / (self.hi - self.lo);
        limit.0 + (t * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // The bold grid only: a line at every power of two.
        if hint.weight().allow_light_points() { Vec::new() } else { self.keys.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

impl plotters::coord::ranged1d::ValueFormatter<f64> for Log2Axis {
    fn format(x: &f64) -> String {
        let s = 2f64.powf(*x).round() as u64;
        if s >= 1024 && s % 1024 == 0 { format!("{}k", s / 1024) } else { s.to_string() }
    }
}
