//! The gRPC codec of `flower.v1`: prost's, except that a request that cannot
//! be decoded is the caller's fault (`INVALID_ARGUMENT`), not the server's
//! (`INTERNAL`, which prost's codec answers and which clients may retry).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstEncoder};

/// Used by the generated service and client code (see `build.rs`).
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(PhantomData)
    }
}

#[derive(Debug)]
pub struct StrictDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("the message could not be decoded as protobuf: {e}")))
    }
}
