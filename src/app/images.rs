//! An image of a cell's result fitted to the answer: one that is over the byte budget is
//! decoded and scaled down (aspect kept, same format) until its base64 fits, and the
//! answer says how big the original is. Decoding and scaling are the `image` crate's
//! (PNG and JPEG; other formats are returned as they are, or refused in words when too
//! big).

use std::io::Cursor;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use image::imageops::FilterType;
use image::{DynamicImage, ImageFormat, ImageReader};

/// The size of an image as the cell produced it, when the answer carries a smaller copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Original {
    pub width: u32,
    pub height: u32,
    /// Bytes of the image file (not of its base64).
    pub bytes: u64,
}

/// An image ready for an answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fitted {
    pub mime: String,
    /// Base64 data, at most the budget.
    pub data: String,
    /// Pixel size of `data`, when it could be read.
    pub size: Option<(u32, u32)>,
    /// Set when `data` is a scaled-down copy.
    pub original: Option<Original>,
}

/// Why an image could not be fitted.
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error("its data is not valid base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error(
        "{mime} of {bytes} bytes is over the answer's {budget} bytes and cannot be scaled here (only PNG and JPEG are)"
    )]
    Unscalable {
        mime: String,
        bytes: usize,
        budget: usize,
    },
    #[error("it could not be decoded to be scaled down: {0}")]
    Decode(#[from] image::ImageError),
    #[error("scaling it failed: {0}")]
    Aborted(String),
}

fn format_of(mime: &str) -> Option<ImageFormat> {
    match mime {
        "image/png" => Some(ImageFormat::Png),
        "image/jpeg" | "image/jpg" => Some(ImageFormat::Jpeg),
        _ => None,
    }
}

/// `data` (base64 of an image of type `mime`) within `budget` bytes of base64: as it is
/// when it fits, else scaled down.
pub(crate) fn fit(mime: &str, data: &str, budget: usize) -> Result<Fitted, FitError> {
    let format = format_of(mime);
    if data.len() <= budget {
        let size = format.and_then(|f| {
            let bytes = STANDARD.decode(data).ok()?;
            ImageReader::with_format(Cursor::new(bytes), f)
                .into_dimensions()
                .ok()
        });
        return Ok(Fitted {
            mime: mime.to_string(),
            data: data.to_string(),
            size,
            original: None,
        });
    }
    let Some(format) = format else {
        return Err(FitError::Unscalable {
            mime: mime.to_string(),
            bytes: data.len() / 4 * 3,
            budget,
        });
    };
    let bytes = STANDARD.decode(data)?;
    let image = ImageReader::with_format(Cursor::new(&bytes), format).decode()?;
    let original = Original {
        width: image.width(),
        height: image.height(),
        bytes: bytes.len() as u64,
    };
    // Encoded size grows about with the pixel count: shrink both sides by the square
    // root of how far over the budget the last try was, with a margin, until it fits.
    let mut scale = ((budget as f64) / (data.len() as f64)).sqrt() * 0.9;
    let mut last = None;
    for _ in 0..8 {
        let w = ((original.width as f64 * scale).round() as u32).max(1);
        let h = ((original.height as f64 * scale).round() as u32).max(1);
        let encoded = encode(&image.resize(w, h, FilterType::Triangle), format)?;
        let b64 = STANDARD.encode(&encoded.0);
        if b64.len() <= budget || (w == 1 && h == 1) {
            return Ok(Fitted {
                mime: mime.to_string(),
                data: b64,
                size: Some(encoded.1),
                original: Some(original),
            });
        }
        scale *= ((budget as f64) / (b64.len() as f64)).sqrt() * 0.9;
        last = Some(b64.len());
    }
    Err(FitError::Unscalable {
        mime: format!("{mime} (still {} bytes after scaling)", last.unwrap_or(0)),
        bytes: bytes.len(),
        budget,
    })
}

/// The image in `format`, with its pixel size.
fn encode(image: &DynamicImage, format: ImageFormat) -> Result<(Vec<u8>, (u32, u32)), FitError> {
    let mut out = Cursor::new(Vec::new());
    // JPEG has no alpha channel: drop it rather than fail.
    let image = match format {
        ImageFormat::Jpeg if image.color().has_alpha() => DynamicImage::ImageRgb8(image.to_rgb8()),
        _ => image.clone(),
    };
    image.write_to(&mut out, format)?;
    Ok((out.into_inner(), (image.width(), image.height())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise_png(w: u32, h: u32) -> String {
        let mut seed = 0x2545_f491_u32;
        let img = image::RgbImage::from_fn(w, h, |_, _| {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let [a, b, c, _] = seed.to_le_bytes();
            image::Rgb([a, b, c])
        });
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(img)
            .write_to(&mut out, ImageFormat::Png)
            .unwrap();
        STANDARD.encode(out.into_inner())
    }

    #[test]
    fn an_image_within_the_budget_is_returned_as_it_is() {
        let data = noise_png(20, 10);
        let f = fit("image/png", &data, 1_000_000).unwrap();
        assert_eq!(f.data, data);
        assert_eq!(f.size, Some((20, 10)));
        assert_eq!(f.original, None);
    }

    #[test]
    fn an_image_over_the_budget_is_scaled_down_keeping_its_aspect() {
        let data = noise_png(900, 300);
        let f = fit("image/png", &data, 60_000).unwrap();
        assert!(f.data.len() <= 60_000, "{}", f.data.len());
        let (w, h) = f.size.unwrap();
        assert!(
            w < 900 && (w as f64 / h as f64 - 3.0).abs() < 0.1,
            "{w}x{h}"
        );
        let o = f.original.unwrap();
        assert_eq!((o.width, o.height), (900, 300));
        // The copy is a real PNG of that size.
        let bytes = STANDARD.decode(&f.data).unwrap();
        let back = image::load_from_memory_with_format(&bytes, ImageFormat::Png).unwrap();
        assert_eq!((back.width(), back.height()), (w, h));
        // JPEG too, alpha or not.
        let jpeg = {
            let img = image::load_from_memory(&STANDARD.decode(&data).unwrap()).unwrap();
            let mut out = Cursor::new(Vec::new());
            img.write_to(&mut out, ImageFormat::Jpeg).unwrap();
            STANDARD.encode(out.into_inner())
        };
        let f = fit("image/jpeg", &jpeg, jpeg.len() / 4).unwrap();
        assert!(f.data.len() <= jpeg.len() / 4);
    }

    #[test]
    fn what_cannot_be_scaled_says_so() {
        let err = fit("image/gif", &"A".repeat(4000), 100).unwrap_err();
        assert!(err.to_string().contains("only PNG and JPEG"), "{err}");
        let err = fit("image/png", &"AAAA".repeat(100), 100).unwrap_err();
        assert!(err.to_string().contains("decoded"), "{err}");
    }
}
