//! The two ways a unary call crosses the proxy, as macros so each service method is one
//! line that says which: `relay!` (through the caller's oncekv client: retried, and
//! tracked when it writes) and `once!` (one attempt on the current member, for calls that
//! are neither idempotent nor tracked by the cluster: membership and auth changes).

/// `relay!(self, request, CallKind, "what", StubClient::method)`.
macro_rules! relay {
    ($self:ident, $request:ident, $kind:expr, $what:literal, $stub:ident :: $method:ident) => {{
        let client = $self.up.client_for(&$request)?;
        let resp = $self
            .up
            .call(
                client,
                $kind,
                $what,
                $request.into_inner(),
                |ch, r| async move { Ok($stub::new(ch).$method(r).await?.into_inner()) },
            )
            .await?;
        Ok(tonic::Response::new(resp))
    }};
}

/// `once!(self, request, StubClient::method)`.
macro_rules! once {
    ($self:ident, $request:ident, $stub:ident :: $method:ident) => {{
        let client = $self.up.client_for(&$request)?;
        match $stub::new(client.current_channel())
            .$method($request.into_inner())
            .await
        {
            Ok(resp) => Ok(tonic::Response::new(resp.into_inner())),
            Err(status) => {
                // The caller decides whether to send it again; the next call goes to
                // another member if this one could not be reached.
                if status.code() == tonic::Code::Unavailable {
                    client.endpoint_failed().await;
                }
                Err(status)
            }
        }
    }};
}

pub(crate) use {once, relay};
