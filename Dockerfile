# The sluice and sluicectl binaries in a distroless image.
FROM golang:1.26 AS build
WORKDIR /src
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/sluice ./cmd/sluice && \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/sluicectl ./cmd/sluicectl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sluice /out/sluicectl /
ENTRYPOINT ["/sluice"]
