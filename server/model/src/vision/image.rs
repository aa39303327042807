//! An image file into what a Qwen2-VL-family tower reads, as llama.cpp's
//! mtmd prepares it for these projectors: decoded to RGB (alpha dropped),
//! resized so both sides are multiples of patch × merge with the pixel
//! count within the projector's bounds ("smart resize", aspect ratio kept,
//! black padding for what rounding leaves), scaled to 0..1 and normalised
//! with the file's mean and standard deviation.

use std::io::Cursor;

use image::imageops::{self, FilterType};
use image::{ImageFormat, ImageReader, Limits, RgbImage};

/// Decoded images larger than this are refused before decoding: 8192 ×
/// 8192. What a tower reads is bounded by the projector's own pixel limit
/// far below it; this bounds the memory of decoding.
pub const MAX_DECODED_PIXELS: u64 = 1 << 26;

/// Why an image was refused.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("the image is not PNG, JPEG or WebP (its first bytes match no supported format)")]
    UnknownFormat,
    #[error("{0:?} images are not supported (PNG, JPEG and WebP are)")]
    Unsupported(ImageFormat),
    #[error("the image could not be decoded: {0}")]
    Decode(#[source] image::ImageError),
    #[error("the image is {width} × {height} pixels, which has no pixels")]
    Empty { width: u32, height: u32 },
    #[error("the image is {width} × {height} pixels, more than the {MAX_DECODED_PIXELS} pixels sluice decodes")]
    TooLarge { width: u32, height: u32 },
}

/// How a projector wants its images.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageSpec {
    /// Side of a square patch, in pixels.
    pub patch_size: u32,
    /// Patches merged per side into one output row (2 for these towers).
    pub merge: u32,
    /// The resized image's pixel count is kept within these.
    pub min_pixels: u32,
    pub max_pixels: u32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

/// An image as the tower reads it: `3 × height × width` values, channel
/// planes of rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<f32>,
}

/// The pixels of `rows` output rows of patches of `patch_size` merged
/// `merge × merge` (saturating): how mtmd turns row bounds into pixel
/// bounds.
pub fn row_pixels(patch_size: u32, merge: u32, rows: u32) -> u32 {
    let row = u64::from(patch_size).pow(2) * u64::from(merge).pow(2);
    u32::try_from(u64::from(rows) * row).unwrap_or(u32::MAX)
}

impl ImageSpec {
    /// The spec with its pixel bounds taken from output-row counts where
    /// given (llama-server's `--image-min-tokens` and `--image-max-tokens`):
    /// each row is `(patch_size × merge)²` pixels.
    pub fn with_token_bounds(self, min_tokens: Option<u32>, max_tokens: Option<u32>) -> ImageSpec {
        let pixels = |rows| row_pixels(self.patch_size, self.merge, rows);
        ImageSpec {
            min_pixels: min_tokens.map_or(self.min_pixels, pixels),
            max_pixels: max_tokens.map_or(self.max_pixels, pixels),
            ..self
        }
    }

    /// The size an image of `width × height` is resized to: each side
    /// rounded to a multiple of patch × merge, then, if the area is out of
    /// bounds, both sides scaled by the same factor (floor when shrinking,
    /// ceil when growing). The arithmetic is mtmd's, in f32.
    pub fn target_size(&self, width: u32, height: u32) -> (u32, u32) {
        let align = (self.patch_size * self.merge) as f32;
        let (w, h) = (width as f32, height as f32);
        let by = |x: f32, f: fn(f32) -> f32| (f(x / align) * align) as u32;
        let mut w_bar = by(w, f32::round).max(align as u32);
        let mut h_bar = by(h, f32::round).max(align as u32);
        let area = u64::from(w_bar) * u64::from(h_bar);
        if area > u64::from(self.max_pixels) {
            let beta = (h * w / self.max_pixels as f32).sqrt();
            h_bar = by(h / beta, f32::floor).max(align as u32);
            w_bar = by(w / beta, f32::floor).max(align as u32);
        } else if area < u64::from(self.min_pixels) {
            let beta = (self.min_pixels as f32 / (h * w)).sqrt();
            h_bar = by(h * beta, f32::ceil);
            w_bar = by(w * beta, f32::ceil);
        }
        (w_bar, h_bar)
    }

    /// Decode `bytes` and prepare the image.
    pub fn prepare(&self, bytes: &[u8]) -> Result<Prepared, ImageError> {
        let rgb = decode(bytes)?;
        let (width, height) = self.target_size(rgb.width(), rgb.height());
        let resized = fit(&rgb, width, height);
        let plane = (width * height) as usize;
        let mut pixels = vec![0.0; 3 * plane];
        for (i, pixel) in resized.pixels().enumerate() {
            for c in 0..3 {
                let value = f32::from(pixel.0[c]) / 255.0;
                pixels[c * plane + i] = (value - self.mean[c]) / self.std[c];
            }
        }
        Ok(Prepared { width, height, pixels })
    }
}

/// PNG, JPEG or WebP bytes as RGB, refusing anything else and anything too
/// large before it is decoded.
pub fn decode(bytes: &[u8]) -> Result<RgbImage, ImageError> {
    let reader = ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(|_| ImageError::UnknownFormat)?;
    match reader.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP) => {}
        Some(other) => return Err(ImageError::Unsupported(other)),
        None => return Err(ImageError::UnknownFormat),
    }
    let (width, height) = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|_| ImageError::UnknownFormat)?
        .into_dimensions()
        .map_err(ImageError::Decode)?;
    if width == 0 || height == 0 {
        return Err(ImageError::Empty { width, height });
    }
    if u64::from(width) * u64::from(height) > MAX_DECODED_PIXELS {
        return Err(ImageError::TooLarge { width, height });
    }
    let mut reader = reader;
    let mut limits = Limits::default();
    limits.max_alloc = Some(16 * MAX_DECODED_PIXELS);
    reader.limits(limits);
    Ok(reader.decode().map_err(ImageError::Decode)?.to_rgb8())
}

/// `image` at `width × height`: copied when it already is that size, else
/// scaled (bicubic) to fit inside, aspect kept, and centred on black.
fn fit(image: &RgbImage, width: u32, height: u32) -> RgbImage {
    if image.dimensions() == (width, height) {
        return image.clone();
    }
    let scale = (width as f32 / image.width() as f32).min(height as f32 / image.height() as f32);
    let inner_w = ((image.width() as f32 * scale).ceil() as u32).clamp(1, width);
    let inner_h = ((image.height() as f32 * scale).ceil() as u32).clamp(1, height);
    let scaled = imageops::resize(image, inner_w, inner_h, FilterType::CatmullRom);
    let mut canvas = RgbImage::new(width, height);
    imageops::replace(&mut canvas, &scaled, i64::from((width - inner_w) / 2), i64::from((height - inner_h) / 2));
    canvas
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen2vl() -> ImageSpec {
        // Qwen2-VL: patches of 14 merged 2 × 2, 8 to 4096 output rows.
        let unit = 14 * 14 * 4;
        ImageSpec {
            patch_size: 14,
            merge: 2,
            min_pixels: 8 * unit,
            max_pixels: 4096 * unit,
            mean: [0.5; 3],
            std: [0.5; 3],
        }
    }

    fn png(width: u32, height: u32) -> Vec<u8> {
        let image = RgbImage::from_fn(width, height, |x, y| image::Rgb([(x * 7) as u8, (y * 5) as u8, 200]));
        let mut bytes = Vec::new();
        image.write_to(&mut Cursor::new(&mut bytes), ImageFormat::Png).expect("encode");
        bytes
    }

    #[test]
    fn token_bounds_set_the_pixel_bounds() {
        let spec = qwen2vl().with_token_bounds(Some(1024), Some(64));
        // Rows of 28 × 28 pixels.
        assert_eq!((spec.min_pixels, spec.max_pixels), (1024 * 784, 64 * 784));
        let unchanged = qwen2vl().with_token_bounds(None, None);
        assert_eq!(unchanged, qwen2vl());
        // 448² at most 64 rows: halved to 224², 8 × 8 rows; 140² (25
        // rows) at least 50: each side times √2, 198 up to 224, 64 rows.
        let capped = qwen2vl().with_token_bounds(None, Some(64));
        assert_eq!(capped.target_size(448, 448), (224, 224));
        let photo = qwen2vl().with_token_bounds(None, Some(1024));
        assert_eq!(photo.target_size(4000, 3000), (1008, 756), "36 × 27 rows");
        let grown = qwen2vl().with_token_bounds(Some(50), None);
        assert_eq!(grown.target_size(140, 140), (224, 224));
        let huge = qwen2vl().with_token_bounds(None, Some(u32::MAX));
        assert_eq!(huge.max_pixels, u32::MAX, "saturates instead of wrapping");
    }

    #[test]
    fn target_sizes_follow_mtmds_formula() {
        let spec = qwen2vl();
        // Worked by hand from the formula: round to 28s; too few pixels
        // grow by ceil, too many shrink by floor.
        for ((w, h), want) in [
            ((448, 448), (448, 448)),
            ((640, 480), (644, 476)),
            ((1, 1), (84, 84)),
            ((100, 20), (196, 56)),
            ((30, 30), (84, 84)),
            ((4000, 3000), (2044, 1540)),
            ((28, 2000), (28, 1988)),
        ] {
            let got = spec.target_size(w, h);
            assert_eq!(got, want, "{w} × {h}");
            assert!(got.0.is_multiple_of(28) && got.1.is_multiple_of(28));
        }
    }

    #[test]
    fn pixels_are_planes_normalised_with_the_files_statistics() {
        let spec = ImageSpec { mean: [0.1, 0.2, 0.3], std: [0.5, 0.25, 2.0], ..qwen2vl() };
        // Already a multiple of 28 and above the 8-row minimum: not resized.
        let prepared = spec.prepare(&png(84, 112)).expect("prepares");
        assert_eq!((prepared.width, prepared.height), (84, 112));
        let plane = 84 * 112;
        // Pixel (x 3, y 2): (21, 10, 200).
        let at = 2 * 84 + 3;
        let want = [(21.0 / 255.0 - 0.1) / 0.5, (10.0 / 255.0 - 0.2) / 0.25, (200.0 / 255.0 - 0.3) / 2.0];
        for (c, want) in want.into_iter().enumerate() {
            assert!((prepared.pixels[c * plane + at] - want).abs() < 1e-6);
        }
    }

    #[test]
    fn resized_images_take_the_target_size() {
        let prepared = qwen2vl().prepare(&png(50, 30)).expect("prepares");
        assert_eq!((prepared.width, prepared.height), (112, 84));
        assert_eq!(prepared.pixels.len(), 3 * 112 * 84);
    }

    #[test]
    fn bad_files_are_refused_by_name() {
        let whole = png(8, 8);
        assert!(matches!(decode(&whole[..whole.len() / 2]), Err(ImageError::Decode(_))));
        assert!(matches!(decode(b"not an image at all"), Err(ImageError::UnknownFormat)));
        let mut gif = Vec::new();
        RgbImage::new(2, 2).write_to(&mut Cursor::new(&mut gif), ImageFormat::Bmp).ok();
        assert!(matches!(decode(&gif), Err(ImageError::UnknownFormat | ImageError::Unsupported(_))));
    }
}
