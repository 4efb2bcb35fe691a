//! `flash_attn3::plot`: CSV parsing and the figure, drawn without a GPU.
use flash_attn3::plot::{Format, PlotError, Point, draw, parse_csv, render_svg};
use std::path::Path;

const OURS: &str = "impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops
rust-fa3,f16,64,512,32,32,0,0.2014,341.1
rust-fa3,f16,64,512,32,32,1,0.1909,180.0
rust-fa3,f16,64,16384,1,32,0,2.5000,420.3
rust-fa3,f16,64,16384,1,32,1,1.6000,425.0
rust-fa3,f16,256,512,32,8,0,0.1600,438.2
rust-fa3,f16,256,16384,1,8,0,2.0000,533.1
";

/// scripts/peers.py's format.
const PEERS: &str = "impl,dtype,hdim,seqlen,batch,heads,causal,ms,tflops
torch-fa2,f16,64,512,32,32,0,0.2578,266.6
torch-cudnn,f16,64,512,32,32,0,0.1727,397.9
torch-cudnn,f16,64,16384,1,32,0,2.3000,453.0
";

/// The anchors' format (shared/anchors/h100_sdpa_fp16.csv): `backend`, and a `pass` column.
const ANCHORS: &str = "backend,hdim,seqlen,batch,heads,causal,pass,ms,tflops
fa2,64,512,32,32,0,fwd,0.2929,234.6
fa2,64,512,32,32,0,bwd,1.1775,145.9
cudnn,64,512,32,32,1,fwd,0.2250,305.4
";

/// A small XML well-formedness check: every tag is closed in order, attribute values
/// are quoted, and `&` starts an entity.
fn assert_well_formed_xml(doc: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = doc;
    let mut roots = 0;
    while let Some(lt) = rest.find('<') {
        check_text(&rest[..lt]);
        let after = &rest[lt..];
        if let Some(body) = after.strip_prefix("<?") {
            rest = &body[body.find("?>").expect("unclosed <?") + 2..];
            continue;
        }
        if let Some(body) = after.strip_prefix("<!--") {
            rest = &body[body.find("-->").expect("unclosed comment") + 3..];
            continue;
        }
        let gt = after.find('>').expect("unclosed tag");
        let tag = &after[1..gt];
        rest = &after[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().unwrap_or_else(|| panic!("</{name}> closes nothing"));
            assert_eq!(open, name.trim(), "</{name}> closes <{open}>");
            continue;
        }
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let name: String = tag.chars().take_while(|c| !c.is_whitespace()).collect();
        assert!(!name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || "-_:.".contains(c)), "bad tag <{tag}>");
        check_attributes(&tag[name.len()..]);
        if stack.is_empty() {
            roots += 1;
        }
        if !self_closing {
            stack.push(name);
        }
    }
    check_text(rest);
    assert!(stack.is_empty(), "unclosed elements {stack:?}");
    assert_eq!(roots, 1, "an XML document has one root element");
}

fn check_text(text: &str) {
    for (i, _) in text.match_indices('&') {
        let entity = &text[i..text[i..].find(';').map_or(text.len(), |j| i + j + 1)];
        assert!(
            ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].contains(&entity) || entity.starts_with("&#"),
            "bare & in {text:?}"
        );
    }
}

fn check_attributes(mut attrs: &str) {
    loop {
        attrs = attrs.trim_start();
        if attrs.is_empty() {
            return;
        }
        let eq = attrs.find('=').unwrap_or_else(|| panic!("attribute without a value: {attrs:?}"));
        let quote = attrs[eq + 1..].chars().next().expect("attribute value");
        assert!(quote == '"' || quote == '\'', "unquoted attribute value in {attrs:?}");
        let value_len = attrs[eq + 2..].find(quote).expect("unterminated attribute value");
        check_text(&attrs[eq + 2..eq + 2 + value_len]);
        attrs = &attrs[eq + 2 + value_len + 1..];
    }
}

#[test]
fn bench_and_peers_csvs_parse() {
    let ours = parse_csv(OURS).unwrap();
    assert_eq!(ours.len(), 6);
    assert_eq!(ours[1], Point { series: "rust-fa3".into(), hdim: 64, seqlen: 512, causal: true, tflops: 180.0 });
    let peers = parse_csv(PEERS).unwrap();
    assert_eq!(peers.iter().filter(|p| p.series == "torch-cudnn").count(), 2);
}

#[test]
fn anchor_csvs_parse_keeping_forward_rows_only() {
    let points = parse_csv(ANCHORS).unwrap();
    assert_eq!(points.len(), 2, "the bwd row is dropped: {points:?}");
    assert_eq!(points[0].series, "fa2");
    assert_eq!(points[0].tflops, 234.6);
    assert!(points[1].causal);
}

#[test]
fn csv_without_a_required_column_is_an_error_naming_it() {
    let err = parse_csv("impl,hdim,seqlen,causal\nx,64,512,0\n").unwrap_err();
    assert!(matches!(err, PlotError::Csv(_)) && err.to_string().contains("tflops"), "{err}");
    let err = parse_csv("hdim,seqlen,causal,tflops\n64,512,0,1.0\n").unwrap_err();
    assert!(err.to_string().contains("impl"), "{err}");
}

#[test]
fn csv_with_a_bad_row_is_an_error_naming_the_line() {
    let err = parse_csv("impl,hdim,seqlen,causal,tflops\nx,64,512,0,1.0\nx,64,abc,0,1.0\n").unwrap_err();
    assert!(err.to_string().contains("line 3") && err.to_string().contains("seqlen"), "{err}");
    let err = parse_csv("impl,hdim,seqlen,causal,tflops\nx,64,512,0\n").unwrap_err();
    assert!(err.to_string().contains("line 2"), "{err}");
}

#[test]
fn svg_is_well_formed_and_names_every_series_and_panel() {
    let ours = parse_csv(OURS).unwrap();
    let mut peers = parse_csv(PEERS).unwrap();
    peers.extend(parse_csv(ANCHORS).unwrap());
    let svg = render_svg(&ours, &peers, "plot test & <title>").unwrap();
    assert_well_formed_xml(&svg);
    for s in ["rust-fa3", "torch-fa2", "torch-cudnn", "fa2", "cudnn", "TFLOP/s", "sequence length"] {
        assert!(svg.contains(s), "the SVG lacks the series or label {s:?}");
    }
    // A panel per (mask, head dim), including hdim 256 causal, which has no data.
    for p in ["hdim 64, non-causal", "hdim 64, causal", "hdim 256, non-causal", "hdim 256, causal"] {
        assert!(svg.contains(p), "the SVG lacks the panel {p:?}");
    }
    // The log2 axis is labelled with the sequence lengths, 512 to 16k.
    for label in ["512", "1k", "2k", "4k", "8k", "16k"] {
        assert!(svg.contains(&format!(">\n{label}\n<")), "the x axis lacks {label}");
    }
}

#[test]
fn repeated_configs_are_drawn_once() {
    // Three rounds of one config: one series, one point (the median), not three.
    let rounds = "impl,hdim,seqlen,causal,tflops\nx,64,512,0,100\nx,64,512,0,300\nx,64,512,0,200\nx,64,1024,0,250\n";
    let once = render_svg(&parse_csv(rounds).unwrap(), &[], "t").unwrap();
    let single = "impl,hdim,seqlen,causal,tflops\nx,64,512,0,200\nx,64,1024,0,250\n";
    assert_eq!(once, render_svg(&parse_csv(single).unwrap(), &[], "t").unwrap());
}

#[test]
fn draw_writes_svg_and_png_files_by_extension() {
    let dir = std::env::temp_dir().join(format!("fa3-plot-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ours = parse_csv(OURS).unwrap();
    let peers = parse_csv(PEERS).unwrap();
    draw(&ours, &peers, "files", &dir.join("fig.svg")).unwrap();
    assert_well_formed_xml(&std::fs::read_to_string(dir.join("fig.svg")).unwrap());
    draw(&ours, &peers, "files", &dir.join("fig.PNG")).unwrap();
    assert!(std::fs::read(dir.join("fig.PNG")).unwrap().starts_with(b"\x89PNG\r\n\x1a\n"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn unknown_image_format_and_empty_data_are_errors() {
    assert_eq!(Format::from_path(Path::new("a.svg")).unwrap(), Format::Svg);
    assert_eq!(Format::from_path(Path::new("a.Png")).unwrap(), Format::Png);
    let err = Format::from_path(Path::new("a.pdf")).unwrap_err();
    assert!(err.to_string().contains("a.pdf"), "{err}");
    assert!(Format::from_path(Path::new("noext")).is_err());
    assert!(matches!(render_svg(&[], &[], "t"), Err(PlotError::NoData)));
}
